// CPU kernels of the activation family: <op>_cpu and <op>_backward_cpu for every op of
// activation.h, from two templates (gated, pointwise) over the functors of functors-inl.h.
//
// Assumes: Note [row layout] (ops/norm/norm.h) on every tensor; f32 / bf16 / f16 (f64 goes to
// the reference kernel, the predicates say so); the op's check has run (outputs overlap no input,
// except a pointwise output that is exactly its input or upstream gradient).
//
// Why it is fast (one Highway source, runtime dispatch to AVX-512/AVX2/SSE4/NEON):
// - Each element is loaded once per pass, its activation computed in f32 registers and the result
//   rounded once on the store. The math is a few FMAs per element (Note [activation math]): one
//   polynomial exponential and one reciprocal, no tanh or erf call. On a small AVX2 core (Zen 1)
//   these kernels are compute-bound, so every instruction counts:
//   - bf16 / f16 outputs use reduced math (Note [output precision] in functors-inl.h: degree-3/4
//     base-2 exponential, estimate + one Newton step instead of a divide, a 6-term erfc fit),
//     accurate to far below half an ulp of the output; f32 outputs keep the full f32 math.
//   - Note [staged evaluation]: the exponential, the reciprocal and the rest run as separate
//     passes over L1 chunks, so the out-of-order window holds many short chains instead of a
//     few long ones.
//   silu_and_mul bf16 went from 2.2 to ~1.5 ns of CPU time per output, gelu (erf form) from 5.0 to
//   2.6. Measured fractions of the copy ceiling: docs/perf/cpu-activation.md.
// - Note [block order]: bf16 is widened and narrowed two vectors at a time with one unpack / one
//   pack instruction per vector on AVX2.
// - f16 loads and stores use the F16C conversion instructions where the target has them (AVX2 and
//   up; they round to nearest even exactly as Note [rounding]); the bit-twiddled conversion of
//   backends/cpu/simd-inl.h (~15 instructions a vector each way) serves the other targets.
// - Note [streaming stores]: when the outputs of a call exceed the last-level cache, they are
//   written with non-temporal stores. A normal store first reads the line it writes (read for
//   ownership), so a bf16 gated kernel moved 8 bytes per output for the 6 its cost counts and
//   could reach at most 75% of a copy (which streams). Small calls (decode) keep normal stores,
//   so their output stays in cache for the next op.
// - OpenMP over tiles of a row block x column block, each about capacity_block elements (Note
//   [tiling], L1), so one decode token (1 x 14336) still spreads over the cores.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/activation/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"
#include "ops/activation/functors-inl.h"
#include "ops/activation/internal.h"
#include "ops/activation/io-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::activation_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// ---- Note [staged evaluation] -----------------------------------------------------------------------
// On a core whose out-of-order window holds few 256-bit operations (Zen 1: about 50), the long
// dependency chain of one element (exponential -> reciprocal -> products -> rounding, ~70 cycles)
// lets only a few vectors be in flight, and the kernel runs far below the units' throughput
// (profiled: the samples spread evenly along the chain). A functor with kStaged splits that
// chain (stage1, stage2, value3 in functors-inl.h) and the loops below run each step as its own
// pass over a chunk of the row, the steps' results going through two small f32 buffers in L1:
// each pass has a short chain and many independent vectors. Measured on Zen 1, one thread:
// silu_and_mul bf16 1.70 ns per output with the reduced math in one pass, 1.50 in three. The f32
// kernels stage only gelu (erf form, 1.3x faster): for the others the divide, not the chain,
// sets the pace, and the extra passes cost more than they save. With FullMath the steps are
// exactly the operations of the one-pass code, so f32 results are the same bits either way.
// kStageChunk elements: the buffers (2 x 1 KiB) and the chunk's inputs stay in L1 next to the
// tile; a multiple of every target's block (2 x 16 lanes on AVX-512); 128 and 512 time the same.
constexpr int64_t kStageChunk = 256;

// For each chunk of [0, n): stage1 (and stage2) of every block of the gate/input `a`, then
// finish(i, count, a, s1, s2) per block, i relative to a's start.
template <class Fn, class T, class Finish>
HWY_INLINE void staged_blocks(const Fn fn, const T* a, int64_t n, Finish&& finish) {
  alignas(64) float s1[kStageChunk], s2[kStageChunk];
  const size_t lanes = hn::Lanes(DF());
  const DF d;
  for (int64_t j = 0; j < n; j += kStageChunk) {
    const int64_t m = std::min(kStageChunk, n - j);
    for_each_block(m, [&](int64_t i, size_t count) {
      const Block v = load_block(a + j + i, count);
      hn::Store(fn.stage1(v.lo), d, s1 + i);
      hn::Store(fn.stage1(v.hi), d, s1 + i + lanes);
    });
    if constexpr (Fn::kThreeStages) {
      for_each_block(m, [&](int64_t i, size_t count) {
        const Block v = load_block(a + j + i, count);
        hn::Store(fn.stage2(v.lo, hn::Load(d, s1 + i)), d, s2 + i);
        hn::Store(fn.stage2(v.hi, hn::Load(d, s1 + i + lanes)), d, s2 + i + lanes);
      });
    }
    const float* second = Fn::kThreeStages ? s2 : s1;
    for_each_block(m, [&](int64_t i, size_t count) {
      const Block first{hn::Load(d, s1 + i), hn::Load(d, s1 + i + lanes)};
      const Block other{hn::Load(d, second + i), hn::Load(d, second + i + lanes)};
      finish(j + i, count, load_block(a + j + i, count), first, other);
    });
  }
}

// The same over interleaved (gate, up) pairs, one vector of pairs at a time: `pairs` points at
// the first pair; finish(i, count, a, b, s1, s2).
struct NoChunkEnd {
  void operator()(int64_t, int64_t) const {}
};
template <class Fn, class T, class Finish, class ChunkEnd = NoChunkEnd>
HWY_INLINE void staged_pairs(const Fn fn, const T* pairs, int64_t n, Finish&& finish,
                             ChunkEnd&& chunk_end = {}) {
  alignas(64) float s1[kStageChunk], s2[kStageChunk];
  const DF d;
  for (int64_t j = 0; j < n; j += kStageChunk) {
    const int64_t m = std::min(kStageChunk, n - j);
    for_each_vector(m, [&](int64_t i, size_t count) {
      VF a, b;
      load_pairs(pairs + 2 * (j + i), count, a, b);
      hn::Store(fn.stage1(a), d, s1 + i);
    });
    if constexpr (Fn::kThreeStages) {
      for_each_vector(m, [&](int64_t i, size_t count) {
        VF a, b;
        load_pairs(pairs + 2 * (j + i), count, a, b);
        hn::Store(fn.stage2(a, hn::Load(d, s1 + i)), d, s2 + i);
      });
    }
    const float* second = Fn::kThreeStages ? s2 : s1;
    for_each_vector(m, [&](int64_t i, size_t count) {
      VF a, b;
      load_pairs(pairs + 2 * (j + i), count, a, b);
      finish(j + i, count, a, b, hn::Load(d, s1 + i), hn::Load(d, second + i));
    });
    chunk_end(j, m);
  }
}

template <class Fn> constexpr bool kStagedFn = Fn::kStaged;

// ---- the two templates ---------------------------------------------------------------------------
template <class Fn> constexpr bool kInterleaved = false;
template <class M> constexpr bool kInterleaved<SwigluOai<M>> = true;

template <class T> HWY_INLINE const T* row_in(const void* base, int64_t stride, int64_t row) {
  return static_cast<const T*>(base) + row * stride;
}
template <class T> HWY_INLINE T* row_out(void* base, int64_t stride, int64_t row) {
  return static_cast<T*>(base) + row * stride;
}

template <class Fn, class T>
void gated_forward_tile(const Fn fn, const ActRows& g, int64_t r0, int64_t r1, int64_t c0,
                        int64_t c1) {
  for (int64_t row = r0; row < r1; ++row) {
    const T* x = row_in<T>(g.x, g.x_stride, row);
    T* y = row_out<T>(g.out, g.out_stride, row) + c0;
    if constexpr (kInterleaved<Fn>) {
      const bool stream = g.stream && stream_aligned(y);
      if constexpr (kStagedFn<Fn> && std::is_same_v<T, bf16_t>) {
        // The results of a chunk go through an f32 buffer, stored two vectors at a time.
        alignas(64) float out[kStageChunk];
        const bool stream_blocks = g.stream && block_aligned(y);
        staged_pairs(
            fn, x + 2 * c0, c1 - c0,
            [&](int64_t i, size_t, VF a, VF b, VF s1, VF s2) {
              hn::Store(hn::Mul(fn.value3(a, s1, s2), fn.up(b)), DF(), out + i % kStageChunk);
            },
            [&](int64_t j, int64_t m) {
              for_each_block(m, [&](int64_t i, size_t count) {
                store_in_order(out + i, y + j + i, count, stream_blocks);
              });
            });
        continue;
      } else if constexpr (kStagedFn<Fn>) {
        staged_pairs(fn, x + 2 * c0, c1 - c0,
                     [&](int64_t i, size_t count, VF a, VF b, VF s1, VF s2) {
                       store_part(hn::Mul(fn.value3(a, s1, s2), fn.up(b)), y + i, count, stream);
                     });
        continue;
      }
      for_each_vector(c1 - c0, [&](int64_t i, size_t count) {
        VF a, b;
        load_pairs(x + 2 * (c0 + i), count, a, b);
        store_part(hn::Mul(fn.value(a), fn.up(b)), y + i, count, stream);
      });
    } else {
      const T* gate = x + g.gate_offset + c0;
      const T* up = x + g.up_offset + c0;
      const bool stream = g.stream && block_aligned(y);
      if constexpr (kStagedFn<Fn>) {
        staged_blocks(fn, gate, c1 - c0, [&](int64_t i, size_t count, const Block& a,
                                             const Block& s1, const Block& s2) {
          const Block b = load_block(up + i, count);
          store_block(Block{hn::Mul(fn.value3(a.lo, s1.lo, s2.lo), b.lo),
                            hn::Mul(fn.value3(a.hi, s1.hi, s2.hi), b.hi)},
                      y + i, count, stream);
        });
        continue;
      }
      for_each_block(c1 - c0, [&](int64_t i, size_t count) {
        const Block a = load_block(gate + i, count), b = load_block(up + i, count);
        store_block(Block{hn::Mul(fn.value(a.lo), b.lo), hn::Mul(fn.value(a.hi), b.hi)}, y + i,
                    count, stream);
      });
    }
  }
}

// d gate = dy * up(b) * act'(a), d up = dy * act(a) * up'(b), stored where x holds gate and up.
template <class Fn>
HWY_INLINE void gated_grads_of(const Fn& fn, VF v, VF slope, VF b, VF gy, VF& grad_a, VF& grad_b) {
  if constexpr (Fn::kIdentityUp) {
    grad_a = hn::Mul(hn::Mul(gy, b), slope);
    grad_b = hn::Mul(gy, v);
  } else {
    grad_a = hn::Mul(hn::Mul(gy, fn.up(b)), slope);
    grad_b = hn::Mul(hn::Mul(gy, v), fn.up_slope(b));
  }
}
template <class Fn, class T>
HWY_INLINE void gated_grads(const Fn& fn, VF a, VF b, VF gy, VF& grad_a, VF& grad_b) {
  VF v, slope;
  fn.value_slope(a, v, slope);
  gated_grads_of(fn, v, slope, b, gy, grad_a, grad_b);
}

template <class Fn, class T>
void gated_backward_tile(const Fn fn, const ActRows& g, int64_t r0, int64_t r1, int64_t c0,
                         int64_t c1) {
  for (int64_t row = r0; row < r1; ++row) {
    const T* x = row_in<T>(g.x, g.x_stride, row);
    const T* dy = row_in<T>(g.dy, g.dy_stride, row) + c0;
    T* dx = row_out<T>(g.out, g.out_stride, row);
    if constexpr (kInterleaved<Fn>) {
      // store_pairs streams one u32 vector: 2 * Lanes elements of T, block_bytes<T>().
      const bool stream = g.stream && block_aligned(dx + 2 * c0);
      if constexpr (kStagedFn<Fn>) {
        staged_pairs(fn, x + 2 * c0, c1 - c0,
                     [&](int64_t i, size_t count, VF a, VF b, VF s1, VF s2) {
                       VF v, slope, grad_a, grad_b;
                       fn.value_slope3(a, s1, s2, v, slope);
                       gated_grads_of(fn, v, slope, b, load_part(dy + i, count), grad_a, grad_b);
                       store_pairs(grad_a, grad_b, dx + 2 * (c0 + i), count, stream);
                     });
        continue;
      }
      for_each_vector(c1 - c0, [&](int64_t i, size_t count) {
        VF a, b, grad_a, grad_b;
        load_pairs(x + 2 * (c0 + i), count, a, b);
        gated_grads<Fn, T>(fn, a, b, load_part(dy + i, count), grad_a, grad_b);
        store_pairs(grad_a, grad_b, dx + 2 * (c0 + i), count, stream);
      });
    } else {
      const T* gate = x + g.gate_offset + c0;
      const T* up = x + g.up_offset + c0;
      T* da = dx + g.gate_offset + c0;
      T* db = dx + g.up_offset + c0;
      const bool stream = g.stream && block_aligned(da) && block_aligned(db);
      if constexpr (kStagedFn<Fn>) {
        staged_blocks(fn, gate, c1 - c0, [&](int64_t i, size_t count, const Block& a,
                                             const Block& s1, const Block& s2) {
          const Block b = load_block(up + i, count), gy = load_block(dy + i, count);
          Block v, slope, grad_a, grad_b;
          fn.value_slope3(a.lo, s1.lo, s2.lo, v.lo, slope.lo);
          fn.value_slope3(a.hi, s1.hi, s2.hi, v.hi, slope.hi);
          gated_grads_of(fn, v.lo, slope.lo, b.lo, gy.lo, grad_a.lo, grad_b.lo);
          gated_grads_of(fn, v.hi, slope.hi, b.hi, gy.hi, grad_a.hi, grad_b.hi);
          store_block(grad_a, da + i, count, stream);
          store_block(grad_b, db + i, count, stream);
        });
        continue;
      }
      for_each_block(c1 - c0, [&](int64_t i, size_t count) {
        const Block a = load_block(gate + i, count), b = load_block(up + i, count);
        const Block gy = load_block(dy + i, count);
        Block grad_a, grad_b;
        gated_grads<Fn, T>(fn, a.lo, b.lo, gy.lo, grad_a.lo, grad_b.lo);
        gated_grads<Fn, T>(fn, a.hi, b.hi, gy.hi, grad_a.hi, grad_b.hi);
        store_block(grad_a, da + i, count, stream);
        store_block(grad_b, db + i, count, stream);
      });
    }
  }
}

// y may be x itself: each block is loaded before it is stored.
template <class Fn, class T>
void pointwise_forward_tile(const Fn fn, const ActRows& g, int64_t r0, int64_t r1, int64_t c0,
                            int64_t c1) {
  for (int64_t row = r0; row < r1; ++row) {
    const T* x = row_in<T>(g.x, g.x_stride, row) + c0;
    T* y = row_out<T>(g.out, g.out_stride, row) + c0;
    const bool stream = g.stream && block_aligned(y);
    if constexpr (kStagedFn<Fn>) {
      staged_blocks(fn, x, c1 - c0, [&](int64_t i, size_t count, const Block& v, const Block& s1,
                                        const Block& s2) {
        store_block(Block{fn.value3(v.lo, s1.lo, s2.lo), fn.value3(v.hi, s1.hi, s2.hi)}, y + i,
                    count, stream);
      });
      continue;
    }
    for_each_block(c1 - c0, [&](int64_t i, size_t count) {
      const Block v = load_block(x + i, count);
      store_block(Block{fn.value(v.lo), fn.value(v.hi)}, y + i, count, stream);
    });
  }
}

// dx = dy * f'(x); dx may be dy itself.
template <class Fn, class T>
void pointwise_backward_tile(const Fn fn, const ActRows& g, int64_t r0, int64_t r1, int64_t c0,
                             int64_t c1) {
  for (int64_t row = r0; row < r1; ++row) {
    const T* x = row_in<T>(g.x, g.x_stride, row) + c0;
    const T* dy = row_in<T>(g.dy, g.dy_stride, row) + c0;
    T* dx = row_out<T>(g.out, g.out_stride, row) + c0;
    const bool stream = g.stream && block_aligned(dx);
    if constexpr (kStagedFn<Fn>) {
      staged_blocks(fn, x, c1 - c0, [&](int64_t i, size_t count, const Block& v, const Block& s1,
                                        const Block& s2) {
        const Block gy = load_block(dy + i, count);
        Block value, slope;
        fn.value_slope3(v.lo, s1.lo, s2.lo, value.lo, slope.lo);
        fn.value_slope3(v.hi, s1.hi, s2.hi, value.hi, slope.hi);
        store_block(Block{hn::Mul(gy.lo, slope.lo), hn::Mul(gy.hi, slope.hi)}, dx + i, count,
                    stream);
      });
      continue;
    }
    for_each_block(c1 - c0, [&](int64_t i, size_t count) {
      const Block v = load_block(x + i, count), gy = load_block(dy + i, count);
      Block value, slope;
      fn.value_slope(v.lo, value.lo, slope.lo);
      fn.value_slope(v.hi, value.hi, slope.hi);
      store_block(Block{hn::Mul(gy.lo, slope.lo), hn::Mul(gy.hi, slope.hi)}, dx + i, count, stream);
    });
  }
}

// ---- dispatch on the dtype and the functor --------------------------------------------------------
template <bool kBackward, bool kGated, class T, class Fn>
void run_tile(const Fn fn, const ActRows& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  if constexpr (kGated && kBackward) gated_backward_tile<Fn, T>(fn, g, r0, r1, c0, c1);
  else if constexpr (kGated) gated_forward_tile<Fn, T>(fn, g, r0, r1, c0, c1);
  else if constexpr (kBackward) pointwise_backward_tile<Fn, T>(fn, g, r0, r1, c0, c1);
  else pointwise_forward_tile<Fn, T>(fn, g, r0, r1, c0, c1);
}

// The gated ops use scaled_silu, gelu_tanh, gelu_erf, fatrelu, swiglu_oai; the pointwise ones
// scaled_silu, gelu_tanh, relu2, xielu (only those pairs are compiled). The functors evaluate
// with the math of the output dtype (Note [output precision] in functors-inl.h).
template <bool kBackward, bool kGated, class T>
void activation_tile_of(const ActRows& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  using M = MathFor<T>;
  const ActParams& p = g.params;
  switch (g.act) {
    case ActKind::scaled_silu:
      return run_tile<kBackward, kGated, T>(ScaledSilu<M>{{}, p.alpha}, g, r0, r1, c0, c1);
    case ActKind::gelu_tanh:
      return run_tile<kBackward, kGated, T>(GeluTanh<M>{{}, p.c}, g, r0, r1, c0, c1);
    default: break;
  }
  if constexpr (kGated) {
    switch (g.act) {
      case ActKind::gelu_erf: return run_tile<kBackward, true, T>(GeluErf<M>{}, g, r0, r1, c0, c1);
      case ActKind::fatrelu:
        return run_tile<kBackward, true, T>(FatRelu{{}, p.threshold}, g, r0, r1, c0, c1);
      case ActKind::swiglu_oai:
        return run_tile<kBackward, true, T>(SwigluOai<M>{p.alpha, p.limit}, g, r0, r1, c0, c1);
      default: return;
    }
  } else {
    switch (g.act) {
      case ActKind::relu2: return run_tile<kBackward, false, T>(Relu2{}, g, r0, r1, c0, c1);
      case ActKind::xielu:
        return run_tile<kBackward, false, T>(Xielu<M>{{}, p.alpha_p, p.alpha_n, p.beta, p.eps}, g,
                                             r0, r1, c0, c1);
      default: return;
    }
  }
}

template <bool kBackward, bool kGated>
void activation_tile(const ActRows& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  switch (g.dtype) {
    case DType::bf16: return activation_tile_of<kBackward, kGated, bf16_t>(g, r0, r1, c0, c1);
    case DType::f16: return activation_tile_of<kBackward, kGated, f16_t>(g, r0, r1, c0, c1);
    default: return activation_tile_of<kBackward, kGated, float>(g, r0, r1, c0, c1);
  }
}

void gated_forward(const ActRows& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  activation_tile<false, true>(g, r0, r1, c0, c1);
}
void gated_backward(const ActRows& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  activation_tile<true, true>(g, r0, r1, c0, c1);
}
void pointwise_forward(const ActRows& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  activation_tile<false, false>(g, r0, r1, c0, c1);
}
void pointwise_backward(const ActRows& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  activation_tile<true, false>(g, r0, r1, c0, c1);
}

#undef OPFORGE_ACTIVATION_F16C
}  // namespace opforge::activation_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_info.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"
#include "opforge/plan.h"

namespace opforge {
namespace activation_cpu {
HWY_EXPORT(gated_forward);
HWY_EXPORT(gated_backward);
HWY_EXPORT(pointwise_forward);
HWY_EXPORT(pointwise_backward);
}  // namespace activation_cpu

namespace {

using TileFn = void(const ActRows&, int64_t, int64_t, int64_t, int64_t);

// Note [streaming stores]: stream when the outputs are larger than the last-level cache. Not the
// smaller share of it that the norms use (cpu::stream_bytes()): these kernels are bound by their
// arithmetic at 16,384 tokens, and on the 2-core Xeon VM streaming made silu_and_mul 16,384 x
// 14,336 6% slower and its backward at 1,024 tokens (59 MB of dx, which the host's L3 kept) 35%
// slower (docs/perf/cpu.md).
bool streams(const TV& out) {
  const double bytes = double(bytes_of(out)), l3 = double(cpu::cpu_info().cache(cpu::CacheLevel::l3).bytes);
  plan::note("stream", bytes > l3, bytes, std::nextafter(l3, 2 * l3));  // Note [plan regimes]
  return bytes > l3;
}

// Streamed stores are weakly ordered: fence them before the task ends.
void fence_streams() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_sfence();
#endif
}

// Tiles of rows x columns of the n columns, each about capacity_block elements (Note [tiling]).
// `tensors_per_element`: the element-sized slices one column touches (gated forward: a, b, y).
void run_tiles(const ActRows& g, int64_t rows, int64_t tensors_per_element, int64_t itemsize,
               TileFn* tile) {
  if (rows <= 0 || g.n <= 0) return;
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors_per_element * itemsize;
  spec.level = cpu::CacheLevel::l1d;
  const int64_t block = cpu::capacity_block(spec);
  const int64_t cols = std::clamp<int64_t>(block, 1, g.n);
  const int64_t rows_per_tile = std::max<int64_t>(block / g.n, 1);
  const int64_t col_tiles = cpu::ceil_div(g.n, cols);
  const int64_t tasks = cpu::ceil_div(rows, rows_per_tile) * col_tiles;
  auto run = [&](int64_t task) {
    const int64_t r0 = (task / col_tiles) * rows_per_tile, c0 = (task % col_tiles) * cols;
    tile(g, r0, std::min(rows, r0 + rows_per_tile), c0, std::min(g.n, c0 + cols));
    if (g.stream) fence_streams();
  };
  // A call of fewer than min_parallel_bytes() a thread (a decode token) runs on the calling
  // thread: waking the other threads costs about what they save (Note [balanced tasks]). The
  // rule was "fits one core's L2", which left silu_and_mul at d 12288 on one thread up to 8
  // tokens (39.9 us; 30.9 us at 12 tokens on two).
  if (cpu::single_thread_call(double(rows) * double(g.n) * double(spec.bytes_per_element))) {
    for (int64_t task = 0; task < tasks; ++task) run(task);
    return;
  }
  cpu::parallel_tasks(tasks, run);
}

// x [..., 2d]: gates in the first half (or the second: mul_and_silu), or interleaved pairs.
enum class Gate : uint8_t { first_half, second_half, interleaved };

ActRows gated_rows(const TV& x, ActKind act, const ActParams& p, Gate gate = Gate::first_half) {
  ActRows g;
  g.dtype = x.dtype;
  g.act = act;
  g.params = p;
  g.n = x.size(-1) / 2;
  g.interleaved = gate == Gate::interleaved;
  g.gate_offset = gate == Gate::second_half ? g.n : 0;
  g.up_offset = gate == Gate::second_half ? 0 : g.n;
  g.x = x.data;
  g.x_stride = x.row_stride();
  return g;
}

ActRows pointwise_rows(const TV& x, ActKind act, const ActParams& p) {
  ActRows g;
  g.dtype = x.dtype;
  g.act = act;
  g.params = p;
  g.n = x.size(-1);
  g.x = x.data;
  g.x_stride = x.row_stride();
  return g;
}

void forward(ActRows g, const TV& y, const TV& x, bool gated) {
  g.out = y.data;
  g.out_stride = y.row_stride();
  g.stream = streams(y);
  if (gated) run_tiles(g, x.rows(), 3, x.itemsize(), HWY_DYNAMIC_DISPATCH(activation_cpu::gated_forward));
  else run_tiles(g, x.rows(), 2, x.itemsize(), HWY_DYNAMIC_DISPATCH(activation_cpu::pointwise_forward));
}

void backward(ActRows g, const TV& dx, const TV& dy, const TV& x, bool gated) {
  g.dy = dy.data;
  g.dy_stride = dy.row_stride();
  g.out = dx.data;
  g.out_stride = dx.row_stride();
  g.stream = streams(dx);
  if (gated) run_tiles(g, x.rows(), 5, x.itemsize(), HWY_DYNAMIC_DISPATCH(activation_cpu::gated_backward));
  else run_tiles(g, x.rows(), 3, x.itemsize(), HWY_DYNAMIC_DISPATCH(activation_cpu::pointwise_backward));
}

ActParams silu_params(float alpha) {
  ActParams p;
  p.alpha = alpha;
  return p;
}
ActParams gelu_tanh_params(float c) {
  ActParams p;
  p.c = c;
  return p;
}
ActParams fatrelu_params(double threshold) {
  ActParams p;
  p.threshold = float(threshold);
  return p;
}
ActParams oai_params(double alpha, double limit) {
  ActParams p;
  p.alpha = float(alpha);
  p.limit = float(limit);
  return p;
}
ActParams xielu_params(double alpha_p, double alpha_n, double beta, double eps) {
  ActParams p;
  p.alpha_p = float(alpha_p);
  p.alpha_n = float(alpha_n);
  p.beta = float(beta);
  p.eps = float(eps);
  return p;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluFastC = 0.7978845608f;
constexpr float kQuickGeluAlpha = 1.702f;

ActRows gelu_rows(const TV& x, std::string_view approximate) {
  return approximate == "tanh" ? gated_rows(x, ActKind::gelu_tanh, gelu_tanh_params(kSqrt2OverPi))
                               : gated_rows(x, ActKind::gelu_erf, {});
}

}  // namespace

const char* activation_cpu_reason(const TV& x) {
  if (!x.device.is_cpu()) return "tensors are not on the cpu";
  switch (x.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

// ---- gated ---------------------------------------------------------------------------------------
void silu_and_mul_cpu(const Context&, const TV& y, const TV& x) {
  forward(gated_rows(x, ActKind::scaled_silu, silu_params(1.0f)), y, x, true);
}
void silu_and_mul_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x) {
  backward(gated_rows(x, ActKind::scaled_silu, silu_params(1.0f)), dx, dy, x, true);
}
void mul_and_silu_cpu(const Context&, const TV& y, const TV& x) {
  forward(gated_rows(x, ActKind::scaled_silu, silu_params(1.0f), Gate::second_half), y, x, true);
}
void mul_and_silu_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x) {
  backward(gated_rows(x, ActKind::scaled_silu, silu_params(1.0f), Gate::second_half), dx, dy, x,
           true);
}
void gelu_and_mul_cpu(const Context&, const TV& y, const TV& x, std::string_view approximate) {
  forward(gelu_rows(x, approximate), y, x, true);
}
void gelu_and_mul_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x,
                               std::string_view approximate) {
  backward(gelu_rows(x, approximate), dx, dy, x, true);
}
void fatrelu_and_mul_cpu(const Context&, const TV& y, const TV& x, double threshold) {
  forward(gated_rows(x, ActKind::fatrelu, fatrelu_params(threshold)), y, x, true);
}
void fatrelu_and_mul_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x,
                                  double threshold) {
  backward(gated_rows(x, ActKind::fatrelu, fatrelu_params(threshold)), dx, dy, x, true);
}
void swigluoai_and_mul_cpu(const Context&, const TV& y, const TV& x, double alpha, double limit) {
  forward(gated_rows(x, ActKind::swiglu_oai, oai_params(alpha, limit), Gate::interleaved), y, x,
          true);
}
void swigluoai_and_mul_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x,
                                    double alpha, double limit) {
  backward(gated_rows(x, ActKind::swiglu_oai, oai_params(alpha, limit), Gate::interleaved), dx, dy,
           x, true);
}

// ---- pointwise -----------------------------------------------------------------------------------
void gelu_new_cpu(const Context&, const TV& y, const TV& x) {
  forward(pointwise_rows(x, ActKind::gelu_tanh, gelu_tanh_params(kSqrt2OverPi)), y, x, false);
}
void gelu_new_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x) {
  backward(pointwise_rows(x, ActKind::gelu_tanh, gelu_tanh_params(kSqrt2OverPi)), dx, dy, x, false);
}
void gelu_fast_cpu(const Context&, const TV& y, const TV& x) {
  forward(pointwise_rows(x, ActKind::gelu_tanh, gelu_tanh_params(kGeluFastC)), y, x, false);
}
void gelu_fast_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x) {
  backward(pointwise_rows(x, ActKind::gelu_tanh, gelu_tanh_params(kGeluFastC)), dx, dy, x, false);
}
void quick_gelu_cpu(const Context&, const TV& y, const TV& x) {
  forward(pointwise_rows(x, ActKind::scaled_silu, silu_params(kQuickGeluAlpha)), y, x, false);
}
void quick_gelu_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x) {
  backward(pointwise_rows(x, ActKind::scaled_silu, silu_params(kQuickGeluAlpha)), dx, dy, x, false);
}
void relu2_cpu(const Context&, const TV& y, const TV& x) {
  forward(pointwise_rows(x, ActKind::relu2, {}), y, x, false);
}
void relu2_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x) {
  backward(pointwise_rows(x, ActKind::relu2, {}), dx, dy, x, false);
}
void xielu_cpu(const Context&, const TV& y, const TV& x, double alpha_p, double alpha_n,
               double beta, double eps) {
  forward(pointwise_rows(x, ActKind::xielu, xielu_params(alpha_p, alpha_n, beta, eps)), y, x, false);
}
void xielu_backward_cpu(const Context&, const TV& dx, const TV& dy, const TV& x, double alpha_p,
                        double alpha_n, double beta, double eps) {
  backward(pointwise_rows(x, ActKind::xielu, xielu_params(alpha_p, alpha_n, beta, eps)), dx, dy, x,
           false);
}

}  // namespace opforge
#endif  // HWY_ONCE
