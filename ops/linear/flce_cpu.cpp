// CPU kernels of fused_linear_cross_entropy and its backward: fused_linear_cross_entropy_cpu,
// fused_linear_cross_entropy_backward_cpu.
//
// Assumes: Note [flce semantics] (linear.h), Note [row layout] for hidden, w, dhidden, dw (padded
// rows go to BLAS as leading dimensions); f32 / bf16 / f16 (f64: the reference); the op's check
// has run (targets are in range); sizes below 2^31 (32-bit BLAS interface).
//
// Note [flce chunks]: the [tokens, vocab] logits never exist. Tokens are taken in chunks of
// token_rows = max(A, B) rows (at most all tokens): A = capacity_block(4 bytes x vocab per row,
// L3, half of it) (Note [tiling]), so a chunk's f32 logits fit half the L3; B = Liger's rule,
// next_pow2(ceil(tokens / ceil(vocab / H))), logits about the size of hidden itself. A alone
// keeps small batches in cache; B takes over at many tokens, where longer chunks let the GEMMs
// run near full speed (OpenBLAS re-packs w for every chunk: at 32 rows a [rows x 16000 x 4096]
// sgemm ran at half the speed of one with 512 rows on the development machine). While A rules,
// the GEMM writes the logits and the log-sum-exp (or gradient) pass reads them back from cache.
// Scratch of a call, counted by flce_cpu_last_scratch_bytes(): token_rows x vocab x 4 for the
// logits; for bf16 / f16 also the chunk of hidden widened to f32 (token_rows x H x 4) and one
// tile of w widened to f32 per thread (vocab_rows x H x 4 each, vocab_rows with every thread's
// tile in half the L3), and in the backward an f32 dhidden chunk and an f32 dw accumulator
// (vocab x H x 4: Liger's accum_dtype=f32; f32 accumulates straight into dw). The unfused form
// holds tokens x vocab x 4 of logits and as much again of their gradient.
//
// Why it is fast: the three products (logits, dhidden = G w, dw += G^T hidden) are OpenBLAS
// sgemm calls on whole chunks (token_rows x vocab x H each); the per-row passes are Highway
// vectors (max, then exp and sums in one pass; the gradient is written over the logits in place)
// with OpenMP over rows. The backward takes each token's lse from the forward (its lse output),
// so its row pass is the gradient alone. Deterministic: the per-token losses are reduced in token order in
// double, db and dw sum the chunks in order, and no product is split over k (Note [one thread
// pool], ops/linear/internal.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear/flce_cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::flce_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// lse = log(sum exp(z)), mean_z = sum(z) / n of one logit row.
void row_stats(const float* z, int64_t n, float* lse, float* mean_z) {
  const DF d;
  VF vmax = hn::Set(d, -INFINITY);
  for_each_vector(n, [&](int64_t i, size_t count) {
    const VF v = count == hn::Lanes(d) ? load(z + i) : hn::IfThenElse(hn::FirstN(d, count), load_n(z + i, count), hn::Set(d, -INFINITY));
    vmax = hn::Max(vmax, v);
  });
  const float m = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const VF vm = hn::Set(d, m);
  VF sum_exp = hn::Zero(d), sum = hn::Zero(d);
  for_each_vector(n, [&](int64_t i, size_t count) {
    const VF v = load_n(z + i, count);
    const VF e = hn::IfThenElseZero(hn::FirstN(d, count), hn::Exp(d, hn::Sub(v, vm)));
    sum_exp = hn::Add(sum_exp, e);
    sum = hn::Add(sum, v);
  });
  *lse = m + std::log(sum_lanes(sum_exp));
  *mean_z = sum_lanes(sum) / float(n);
}

// z[v] = g * exp(z[v] - lse) - smooth, in place (smooth = g * label_smoothing / vocab).
void row_gradient(float* z, int64_t n, float lse, float g, float smooth) {
  const DF d;
  const VF vl = hn::Set(d, lse), vg = hn::Set(d, g), vs = hn::Set(d, smooth);
  for_each_vector(n, [&](int64_t i, size_t count) {
    const VF p = hn::Exp(d, hn::Sub(load_n(z + i, count), vl));
    store_n(hn::MulSub(vg, p, vs), z + i, count);
  });
}

}  // namespace opforge::flce_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cstring>
#include <omp.h>

#include "backends/cpu/cpu_info.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"
#include "ops/linear/internal.h"

namespace opforge {
namespace flce_cpu {
HWY_EXPORT(row_stats);
HWY_EXPORT(row_gradient);
}  // namespace flce_cpu

namespace {

using gemm_cpu::Scratch;
using gemm_cpu::ScratchMeter;

thread_local int64_t last_scratch_bytes = 0;

// Rows of `floats_per_row` f32 each that fit half of the L3 (Note [tiling]), `copies` times over.
int64_t rows_in_half_l3(int64_t floats_per_row, int64_t copies = 1) {
  cpu::TileSpec spec;
  spec.bytes_per_element = 4 * copies;
  spec.multiplier = std::max<int64_t>(floats_per_row, 1);
  spec.level = cpu::CacheLevel::l3;
  return cpu::capacity_block(spec);
}

int threads() { return std::max(1, cpu::cpu_info().threads); }
// Per-thread slots of the w tile scratch: every thread a parallel region may have now.
int64_t slots() { return std::max(threads(), omp_get_max_threads()); }

// What both kernels share: sizes, the chunk plan, and w / hidden as f32 panels.
struct Problem {
  const TensorView &hidden, &w, &target, &b;
  int64_t tokens, h, vocab, ignore_index;
  float label_smoothing;
  FlceChunks chunks;
  ScratchMeter meter;
  bool f32;

  Problem(const TensorView& hidden_, const TensorView& w_, const TensorView& target_,
          const TensorView& b_, int64_t ignore_index_, double ls)
      : hidden(hidden_), w(w_), target(target_), b(b_), tokens(hidden_.size(0)),
        h(hidden_.size(1)), vocab(w_.size(0)), ignore_index(ignore_index_),
        label_smoothing(float(ls)), chunks(flce_chunks(tokens, vocab, h)),
        f32(hidden_.dtype == DType::f32) {
  }
};

// Rows [n0, n1) of hidden as f32: in place for f32, else widened into `buf`.
const float* hidden_rows(const Problem& p, int64_t n0, int64_t n1, float* buf, int64_t* ld) {
  if (p.f32) {
    *ld = p.hidden.row_stride();
    return static_cast<const float*>(p.hidden.data) + n0 * *ld;
  }
  gemm_cpu::widen_rows(p.hidden, n0, n1, buf);
  *ld = p.h;
  return buf;
}

// logits[r, v] = hidden[n0 + r] . w[v] + b[v] for the chunk's rows (ld = vocab). f32: one
// product on w in place; 16-bit: one OpenMP task per tile of w's rows, widened into the task
// thread's slot of `w_tiles` (vocab_rows x H floats per thread). Note [one thread pool].
void chunk_logits(const Problem& p, const float* x, int64_t ldx, int64_t rows, float* logits,
                  float* w_tiles) {
  const bool bias = p.b.defined();
  if (bias) {
    std::unique_ptr<float[]> b32(new float[size_t(p.vocab)]);
    gemm_cpu::widen_rows(p.b, 0, 1, b32.get());
    for (int64_t r = 0; r < rows; ++r) std::memcpy(logits + r * p.vocab, b32.get(), size_t(p.vocab) * 4);
  }
  if (p.f32) {
    gemm_cpu::sgemm(false, true, rows, p.vocab, p.h, x, ldx, static_cast<const float*>(p.w.data),
                    p.w.row_stride(), bias ? 1.0f : 0.0f, logits, p.vocab);
    return;
  }
  const cpu::RowTasks tiles{p.vocab, p.chunks.vocab_rows};
  cpu::parallel_tasks(tiles.count(), [&](int64_t t) {
    const int64_t v0 = tiles.begin(t), v1 = tiles.end(t);
    float* wt = w_tiles + int64_t(omp_get_thread_num()) * p.chunks.vocab_rows * p.h;
    gemm_cpu::widen_block_serial(p.w, v0, v1, 0, p.h, wt);
    gemm_cpu::sgemm_serial(false, true, rows, v1 - v0, p.h, x, ldx, wt, p.h, bias ? 1.0f : 0.0f,
                           logits + v0, p.vocab);
  });
}

// dx[r, :] = sum over v of g[r, v] w[v, :] (ld of g = vocab). 16-bit: one OpenMP task per block
// of H columns, walking w's tiles in order (a fixed order of the sums over v).
void chunk_dhidden(const Problem& p, const float* g, int64_t rows, float* dx, int64_t lddx,
                   float* w_tiles) {
  if (p.f32) {
    gemm_cpu::sgemm(false, false, rows, p.h, p.vocab, g, p.vocab, static_cast<const float*>(p.w.data),
                    p.w.row_stride(), 0.0f, dx, lddx);
    return;
  }
  const cpu::RowTasks columns{p.h, cpu::ceil_div(p.h, threads())};
  cpu::parallel_tasks(columns.count(), [&](int64_t t) {
    const int64_t h0 = columns.begin(t), width = columns.end(t) - h0;
    float* wt = w_tiles + int64_t(omp_get_thread_num()) * p.chunks.vocab_rows * p.h;
    const int64_t tile = std::max<int64_t>(1, p.chunks.vocab_rows * p.h / std::max<int64_t>(width, 1));
    for (int64_t v0 = 0; v0 < p.vocab; v0 += tile) {
      const int64_t v1 = std::min(p.vocab, v0 + tile);
      gemm_cpu::widen_block_serial(p.w, v0, v1, h0, width, wt);
      gemm_cpu::sgemm_serial(false, false, rows, width, v1 - v0, g + v0, p.vocab, wt, width,
                             v0 == 0 ? 0.0f : 1.0f, dx + h0, lddx);
    }
  });
}

// Row tasks over a chunk's logit rows: Note [tiling] over L2 with a whole row per unit.
cpu::RowTasks logit_row_tasks(const Problem& p, int64_t rows) {
  cpu::TileSpec spec;
  spec.bytes_per_element = 4;
  spec.multiplier = p.vocab;
  return {rows, cpu::capacity_block(spec)};
}

double upstream_of(const TensorView& dloss, Reduction r, int64_t n, double scale) {
  if (r == Reduction::none) return load_as_double(dloss.data, dloss.dtype, n * dloss.stride(0));
  return load_as_double(dloss.data, dloss.dtype, 0) * scale;
}

double mean_scale(Reduction r, const TensorView& target, int64_t ignore_index) {
  if (r != Reduction::mean) return 1.0;
  const int64_t counted = count_targets(target, ignore_index);
  return counted > 0 ? 1.0 / double(counted) : 0.0;
}

// A view of rows [n0, n1) of a 2-d row-layout tensor.
TensorView row_slice(const TensorView& t, int64_t n0, int64_t n1) {
  const int64_t strides[2] = {t.row_stride(), 1};
  void* data = static_cast<char*>(t.data) + n0 * t.row_stride() * t.itemsize();
  return TensorView(data, t.dtype, Shape{n1 - n0, t.size(1)}, strides, t.device);
}

}  // namespace

FlceChunks flce_chunks(int64_t tokens, int64_t vocab, int64_t hidden) {
  FlceChunks c;
  // Liger's rule: about as many logits per chunk as hidden has elements, in a power of two.
  const int64_t inc_factor = cpu::ceil_div(vocab, std::max<int64_t>(hidden, 1));
  int64_t liger_rows = 1;
  while (liger_rows < cpu::ceil_div(tokens, inc_factor)) liger_rows *= 2;
  c.token_rows = std::max(rows_in_half_l3(vocab), liger_rows);
  c.token_rows = std::max<int64_t>(1, std::min(std::max<int64_t>(tokens, 1), c.token_rows));
  c.vocab_rows = std::max<int64_t>(1, std::min(std::max<int64_t>(vocab, 1), rows_in_half_l3(hidden, threads())));
  return c;
}

int64_t flce_cpu_last_scratch_bytes() { return last_scratch_bytes; }

void fused_linear_cross_entropy_cpu(const Context&, const TensorView& loss,
                                    const TensorView& lse, const TensorView& hidden,
                                    const TensorView& w,
                                    const TensorView& target, const TensorView& b,
                                    int64_t ignore_index, double label_smoothing,
                                    std::string_view reduction) {
  const Reduction r = parse_reduction(FusedLinearCrossEntropy::name, reduction);
  Problem p(hidden, w, target, b, ignore_index, label_smoothing);
  const int64_t chunk = p.chunks.token_rows;
  std::vector<double> losses(size_t(p.tokens), 0.0);
  p.meter.add(p.tokens * 8);
  {
    Scratch logits(p.meter, chunk * p.vocab);
    Scratch x_buf(p.meter, p.f32 ? 0 : chunk * p.h);
    Scratch w_tile(p.meter, p.f32 ? 0 : slots() * p.chunks.vocab_rows * p.h);
    auto* stats_fn = HWY_DYNAMIC_DISPATCH(flce_cpu::row_stats);
    const float ls = p.label_smoothing;
    for (int64_t n0 = 0; n0 < p.tokens; n0 += chunk) {
      const int64_t n1 = std::min(p.tokens, n0 + chunk), rows = n1 - n0;
      int64_t ldx = 0;
      const float* x = hidden_rows(p, n0, n1, x_buf.get(), &ldx);
      chunk_logits(p, x, ldx, rows, logits.get(), w_tile.get());
      const cpu::RowTasks tasks = logit_row_tasks(p, rows);
      cpu::parallel_tasks(tasks.count(), [&](int64_t task) {
        for (int64_t row = tasks.begin(task); row < tasks.end(task); ++row) {
          const int64_t n = n0 + row, t = target_at(target, n);
          const float* z = logits.get() + row * p.vocab;
          float lse_n = 0, mean_z = 0;
          stats_fn(z, p.vocab, &lse_n, &mean_z);
          store_from_double(lse.data, lse.dtype, n * lse.stride(0), lse_n);
          if (t == ignore_index) continue;
          losses[size_t(n)] = (1.0 - ls) * (double(lse_n) - z[t]) + ls * (double(lse_n) - mean_z);
        }
      });
    }
  }
  if (r == Reduction::none) {
    for (int64_t n = 0; n < p.tokens; ++n) store_from_double(loss.data, loss.dtype, n * loss.stride(0), losses[size_t(n)]);
  } else {
    double total = 0;
    for (double l : losses) total += l;  // token order: deterministic
    store_from_double(loss.data, loss.dtype, 0, total * mean_scale(r, target, ignore_index));
  }
  last_scratch_bytes = p.meter.peak;
}

void fused_linear_cross_entropy_backward_cpu(
    const Context&, const TensorView& dhidden, const TensorView& dw, const TensorView& db,
    const TensorView& dloss, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& lse, const TensorView& b, int64_t ignore_index,
    double label_smoothing, std::string_view reduction) {
  const Reduction r = parse_reduction(FusedLinearCrossEntropyBackward::name, reduction);
  Problem p(hidden, w, target, b, ignore_index, label_smoothing);
  const int64_t chunk = p.chunks.token_rows, tile = p.chunks.vocab_rows;
  const double scale = mean_scale(r, target, ignore_index);
  Scratch logits(p.meter, chunk * p.vocab);
  Scratch x_buf(p.meter, p.f32 ? 0 : chunk * p.h);
  Scratch w_tile(p.meter, p.f32 ? 0 : slots() * tile * p.h);
  Scratch dx_buf(p.meter, p.f32 ? 0 : chunk * p.h);
  Scratch dw_acc(p.meter, p.f32 ? 0 : p.vocab * p.h);
  Scratch db_acc(p.meter, p.vocab);
  float* dwp = p.f32 ? static_cast<float*>(dw.data) : dw_acc.get();
  const int64_t lddw = p.f32 ? dw.row_stride() : p.h;
  if (p.tokens == 0) gemm_cpu::sgemm(false, false, p.vocab, p.h, 0, nullptr, 1, nullptr, 1, 0.0f, dwp, lddw);
  std::fill(db_acc.get(), db_acc.get() + p.vocab, 0.0f);
  auto* grad_fn = HWY_DYNAMIC_DISPATCH(flce_cpu::row_gradient);
  const float ls = p.label_smoothing;
  for (int64_t n0 = 0; n0 < p.tokens; n0 += chunk) {
    const int64_t n1 = std::min(p.tokens, n0 + chunk), rows = n1 - n0;
    int64_t ldx = 0;
    const float* x = hidden_rows(p, n0, n1, x_buf.get(), &ldx);
    float* g = logits.get();
    chunk_logits(p, x, ldx, rows, g, w_tile.get());
    const cpu::RowTasks tasks = logit_row_tasks(p, rows);
    cpu::parallel_tasks(tasks.count(), [&](int64_t task) {  // G = dloss/dlogits, in place
      for (int64_t row = tasks.begin(task); row < tasks.end(task); ++row) {
        const int64_t n = n0 + row, t = target_at(target, n);
        float* z = g + row * p.vocab;
        if (t == ignore_index) {
          std::fill(z, z + p.vocab, 0.0f);
          continue;
        }
        const float up = float(upstream_of(dloss, r, n, scale));
        const float lse_n = float(load_as_double(lse.data, lse.dtype, n * lse.stride(0)));
        grad_fn(z, p.vocab, lse_n, up, up * ls / float(p.vocab));
        z[t] -= up * (1.0f - ls);
      }
    });
    // db += column sums of G in row order.
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t v = 0; v < p.vocab; ++v) db_acc.get()[v] += g[row * p.vocab + v];
    // dhidden[chunk] = G @ w; dw += G^T @ hidden[chunk] (whole-k products, Note [one thread pool]).
    float* dxp = p.f32 ? static_cast<float*>(dhidden.data) + n0 * dhidden.row_stride() : dx_buf.get();
    chunk_dhidden(p, g, rows, dxp, p.f32 ? dhidden.row_stride() : p.h, w_tile.get());
    gemm_cpu::sgemm(true, false, p.vocab, p.h, rows, g, p.vocab, x, ldx, n0 == 0 ? 0.0f : 1.0f, dwp, lddw);
    if (!p.f32) gemm_cpu::store_rows(dx_buf.get(), p.h, row_slice(dhidden, n0, n1), 0, p.h);
  }
  if (!p.f32) gemm_cpu::store_rows(dwp, lddw, dw, 0, p.h);
  gemm_cpu::store_rows(db_acc.get(), p.vocab, db, 0, p.vocab);
  last_scratch_bytes = p.meter.peak;
}

namespace {
const char* flce_reason(const TensorView& hidden, const TensorView& w) {
  if (!hidden.device.is_cpu()) return "tensors are not on the cpu";
  switch (hidden.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: break;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
  for (int64_t s : {hidden.size(0), hidden.size(1), w.size(0), hidden.row_stride(), w.row_stride()})
    if (s > int64_t(INT32_MAX)) return "a size exceeds the 32-bit BLAS interface";
  return nullptr;
}
}  // namespace

// The forward then the backward (reading the lse just written): the CPU kernels hold a token
// chunk's logits in f32 scratch either way, so computing them twice costs the one extra GEMM that
// a larger chunk budget would save; the CUDA kernel is where the single pass matters.
void fused_linear_cross_entropy_with_grad_cpu(
    const Context& ctx, const TensorView& loss, const TensorView& lse, const TensorView& dhidden,
    const TensorView& dw, const TensorView& db, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& dloss, const TensorView& b, int64_t ignore_index,
    double label_smoothing, std::string_view reduction) {
  fused_linear_cross_entropy_cpu(ctx, loss, lse, hidden, w, target, b, ignore_index, label_smoothing,
                                 reduction);
  const int64_t forward_peak = last_scratch_bytes;
  fused_linear_cross_entropy_backward_cpu(ctx, dhidden, dw, db, dloss, hidden, w, target, lse, b,
                                          ignore_index, label_smoothing, reduction);
  last_scratch_bytes = std::max(last_scratch_bytes, forward_peak);
}

const char* fused_linear_cross_entropy_with_grad_cpu_applicable(
    const TensorView&, const TensorView&, const TensorView& dhidden, const TensorView& dw,
    const TensorView&, const TensorView& hidden, const TensorView& w, const TensorView&,
    const TensorView&, const TensorView&, int64_t, double, std::string_view) {
  if (const char* why = flce_reason(hidden, w)) return why;
  if (dhidden.row_stride() > int64_t(INT32_MAX) || dw.row_stride() > int64_t(INT32_MAX))
    return "a size exceeds the 32-bit BLAS interface";
  return nullptr;
}

const char* fused_linear_cross_entropy_cpu_applicable(const TensorView&, const TensorView&,
                                                      const TensorView& hidden,
                                                      const TensorView& w, const TensorView&,
                                                      const TensorView&, int64_t, double,
                                                      std::string_view) {
  return flce_reason(hidden, w);
}

const char* fused_linear_cross_entropy_backward_cpu_applicable(
    const TensorView& dhidden, const TensorView& dw, const TensorView&, const TensorView&,
    const TensorView& hidden, const TensorView& w, const TensorView&, const TensorView&,
    const TensorView&, int64_t, double, std::string_view) {
  if (const char* why = flce_reason(hidden, w)) return why;
  if (dhidden.row_stride() > int64_t(INT32_MAX) || dw.row_stride() > int64_t(INT32_MAX))
    return "a size exceeds the 32-bit BLAS interface";
  return nullptr;
}

}  // namespace opforge
#endif  // HWY_ONCE
