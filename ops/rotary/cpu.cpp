// CPU kernel of the rotary family: rotary_cpu_run serves rotary_embedding_cpu,
// rotary_embedding_backward_cpu, apply_rotary_emb_cpu and apply_rotary_emb_backward_cpu.
//
// Assumes: the op's check has run; f32 / bf16 / f16 (f64 goes to the reference: the predicates
// say so); unit-stride heads, any token and head strides; rotary_dim even.
//
// Why it is fast:
// - The op is memory-bound (6 flops per pair, 2 elements read and written): each token's cos
//   and sin (one cache row, picked by positions) are widened to f32 once into an L1 buffer and
//   then applied to all query and key heads of the token, so the cache costs one row read per
//   token and the heads stream through exactly once, read and written in place.
// - One Highway source, runtime dispatch (4 / 8 / 16 f32 lanes). NeoX pairs are two aligned
//   half-vectors (x1 from the first half, x2 from the second). GPT-J pairs are adjacent lanes:
//   cos and +-sin are expanded per token into interleaved rows, and the partner of each lane
//   comes from Reverse2 (a swap of adjacent lanes), so both styles run at full vector width.
// - bf16 / f16 are widened to f32 in registers and rounded once on the store (Note [vector
//   rounding]).
// - OpenMP over tasks of tokens; tokens per task from capacity_block (Note [tiling]) so one
//   task's heads fit half of a core's L2; one task (decode) runs without an OpenMP region.
//
// Measured 2026-11-26, `opforge bench --group large --dtype bf16`, on the project's shared 2-core
// AVX2 machine while other builds kept its load average at 12-15, so every figure is several
// times slower than on an idle machine (the copy ceiling measured in the same runs was 2.5-5.0
// GB/s, against 23.8 GB/s idle in docs/perf/cpu.md); rms_norm_cpu, run alongside as a yardstick,
// reached 24% of that ceiling at 1024 and 16384 tokens.
// rotary_embedding 1024 / 16384 tokens (32 + 8 heads x 128) reached 27% / 28% of the
// ceiling in that run (apply_rotary_emb 28% / 23%), 16-36x the reference kernel in the same run.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/rotary/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstring>
#include <memory>

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"
#include "ops/rotary/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::rotary_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// The f32 factors of one token: NeoX: cos[half], sin[half] (sin signed by sin_sign);
// GPT-J: cos2[2 half] = (c0, c0, c1, c1, ...), sin2[2 half] = (-s0, s0, -s1, s1, ...).
template <class T>
void token_factors(const RotaryPlan& p, int64_t row, float* cos_f, float* sin_f) {
  const T* c = static_cast<const T*>(p.cos) + row * p.cos_stride;
  const T* s = static_cast<const T*>(p.sin) + row * p.sin_stride;
  const float sign = float(p.sin_sign);
  if (p.neox) {
    for (int64_t i = 0; i < p.half; ++i) {
      cos_f[i] = float(c[i]);
      sin_f[i] = sign * float(s[i]);
    }
    return;
  }
  for (int64_t i = 0; i < p.half; ++i) {
    const float ci = float(c[i]), si = sign * float(s[i]);
    cos_f[2 * i] = cos_f[2 * i + 1] = ci;
    sin_f[2 * i] = -si;
    sin_f[2 * i + 1] = si;
  }
}

template <class T>
HWY_INLINE void rotate_head_neox(const T* x, T* y, const float* cos_f, const float* sin_f,
                                 int64_t half) {
  for_each_vector(half, [&](int64_t i, size_t count) {
    const VF x1 = load_n(x + i, count), x2 = load_n(x + half + i, count);
    const VF c = load_n(cos_f + i, count), s = load_n(sin_f + i, count);
    const VF o1 = hn::NegMulAdd(x2, s, hn::Mul(x1, c));  // x1 c - x2 s
    const VF o2 = hn::MulAdd(x1, s, hn::Mul(x2, c));     // x2 c + x1 s
    store_n(o1, y + i, count);
    store_n(o2, y + half + i, count);
  });
}

// Lanes come in (x1, x2) pairs; counts are even, so a pair never straddles two vectors.
template <class T>
HWY_INLINE void rotate_head_gptj(const T* x, T* y, const float* cos2, const float* sin2,
                                 int64_t rotary_dim) {
  for_each_vector(rotary_dim, [&](int64_t i, size_t count) {
    const VF v = load_n(x + i, count);
    const VF partner = hn::Reverse2(DF(), v);
    store_n(hn::MulAdd(partner, load_n(sin2 + i, count), hn::Mul(v, load_n(cos2 + i, count))),
            y + i, count);
  });
}

template <class T>
void rotary_tokens_typed(const RotaryPlan& p, int64_t begin, int64_t end) {
  const int64_t rotary_dim = 2 * p.half;
  std::unique_ptr<float[]> factors(new float[size_t(2 * rotary_dim)]);
  float* cos_f = factors.get();
  float* sin_f = factors.get() + rotary_dim;
  const size_t pass_bytes = size_t(p.head_size - rotary_dim) * sizeof(T);
  for (int64_t t = begin; t < end; ++t) {
    token_factors<T>(p, p.positions ? p.positions[t] : t, cos_f, sin_f);
    for (int part_index = 0; part_index < p.n_parts; ++part_index) {
      const RotaryPart& part = p.parts[part_index];
      const T* src = static_cast<const T*>(part.src) + t * part.src_token_stride;
      T* dst = static_cast<T*>(part.dst) + t * part.dst_token_stride;
      for (int64_t h = 0; h < part.n_heads; ++h) {
        const T* x = src + h * part.src_head_stride;
        T* y = dst + h * part.dst_head_stride;
        if (p.neox) rotate_head_neox(x, y, cos_f, sin_f, p.half);
        else rotate_head_gptj(x, y, cos_f, sin_f, rotary_dim);
        if (pass_bytes > 0 && x != y) std::memcpy(y + rotary_dim, x + rotary_dim, pass_bytes);
      }
    }
  }
}

void rotary_tokens(const RotaryPlan& p, int64_t begin, int64_t end) {
  switch (p.dtype) {
    case DType::bf16: return rotary_tokens_typed<bf16_t>(p, begin, end);
    case DType::f16: return rotary_tokens_typed<f16_t>(p, begin, end);
    default: return rotary_tokens_typed<float>(p, begin, end);
  }
}

}  // namespace opforge::rotary_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace rotary_cpu {
HWY_EXPORT(rotary_tokens);
}  // namespace rotary_cpu

void rotary_cpu_run(const RotaryPlan& p) {
  int64_t elements_per_token = 0;
  for (int i = 0; i < p.n_parts; ++i) elements_per_token += p.parts[i].n_heads * p.head_size;
  // Note [tiling]: a token's heads, read and written (two tensors' worth when out of place).
  cpu::TileSpec spec;
  spec.bytes_per_element = 2 * dtype_size(p.dtype);
  spec.multiplier = std::max<int64_t>(elements_per_token, 1);
  spec.level = cpu::CacheLevel::l2;
  // Tokens are independent: Note [balanced tasks].
  const cpu::RowTasks tasks = cpu::balanced(cpu::row_blocks(p.tokens, spec));
  auto* fn = HWY_DYNAMIC_DISPATCH(rotary_cpu::rotary_tokens);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { fn(p, tasks.begin(t), tasks.end(t)); });
}

const char* rotary_cpu_dtype_reason(const TensorView& t) {
  if (!t.device.is_cpu()) return "tensors are not on the cpu";
  switch (t.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

}  // namespace opforge
#endif  // HWY_ONCE
