// CPU kernels of fused_linear_cross_entropy and its backward: fused_linear_cross_entropy_cpu,
// fused_linear_cross_entropy_backward_cpu.
//
// Assumes: Note [flce semantics] (linear.h), Note [row layout] for hidden, w, dhidden, dw (padded
// rows go to BLAS as leading dimensions); f32 / bf16 / f16 (f64: the reference); the op's check
// has run (targets are in range); sizes below 2^31 (32-bit BLAS interface).
//
// Note [flce chunks]: the [tokens, vocab] logits never exist. Tokens are taken in chunks of
// token_rows = capacity_block(4 bytes x vocab per row, L3, half of it) rows (Note [tiling]): one
// chunk's f32 logits fill at most half the L3, so the GEMM writes them and the log-sum-exp (or
// gradient) pass reads them back from cache. Scratch of a call, counted by flce_cpu_last_scratch_
// bytes(): token_rows x vocab x 4 for the logits; for bf16 / f16 also the chunk of hidden widened
// to f32 (token_rows x H x 4) and a tile of w widened to f32 (vocab_rows x H x 4, vocab_rows from
// the same rule with H per row), and in the backward an f32 dhidden chunk and an f32 dw
// accumulator (vocab x H x 4: Liger's accum_dtype=f32; f32 accumulates straight into dw). The
// unfused form holds tokens x vocab x 4 of logits and as much again of their gradient.
//
// Why it is fast: the three products (logits, dhidden = G w, dw += G^T hidden) are OpenBLAS
// sgemm calls on whole chunks (token_rows x vocab x H each); the per-row passes are Highway
// vectors (max, then exp and sums in one pass; the gradient is written over the logits in place)
// with OpenMP over rows. Deterministic: the per-token losses are reduced in token order in
// double, db and dw sum the chunks in order, and OpenBLAS never splits the k dimension.
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

#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"
#include "ops/linear/gemm.h"
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

int64_t rows_in_half_l3(int64_t floats_per_row) {
  cpu::TileSpec spec;
  spec.bytes_per_element = 4;
  spec.multiplier = std::max<int64_t>(floats_per_row, 1);
  spec.level = cpu::CacheLevel::l3;
  return cpu::capacity_block(spec);
}

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
    if (f32) chunks.vocab_rows = vocab;  // w is used in place, no tiles
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

// Rows [v0, v1) of w as f32: in place for f32, else widened into `buf`.
const float* w_rows(const Problem& p, int64_t v0, int64_t v1, float* buf, int64_t* ld) {
  if (p.f32) {
    *ld = p.w.row_stride();
    return static_cast<const float*>(p.w.data) + v0 * *ld;
  }
  gemm_cpu::widen_rows(p.w, v0, v1, buf);
  *ld = p.h;
  return buf;
}

// logits[r, v] = hidden[n0 + r] . w[v] + b[v] for the chunk's rows (ld = vocab).
void chunk_logits(const Problem& p, const float* x, int64_t ldx, int64_t rows, float* logits,
                  float* w_tile) {
  std::unique_ptr<float[]> bias;
  if (p.b.defined()) {
    bias.reset(new float[size_t(p.vocab)]);
    gemm_cpu::widen_rows(p.b, 0, 1, bias.get());
    for (int64_t r = 0; r < rows; ++r) std::memcpy(logits + r * p.vocab, bias.get(), size_t(p.vocab) * 4);
  }
  for (int64_t v0 = 0; v0 < p.vocab; v0 += p.chunks.vocab_rows) {
    const int64_t v1 = std::min(p.vocab, v0 + p.chunks.vocab_rows);
    int64_t ldw = 0;
    const float* wt = w_rows(p, v0, v1, w_tile, &ldw);
    gemm_cpu::sgemm(false, true, rows, v1 - v0, p.h, x, ldx, wt, ldw, p.b.defined() ? 1.0f : 0.0f,
                      logits + v0, p.vocab);
  }
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
  c.token_rows = std::max<int64_t>(1, std::min(std::max<int64_t>(tokens, 1), rows_in_half_l3(vocab)));
  c.vocab_rows = std::max<int64_t>(1, std::min(std::max<int64_t>(vocab, 1), rows_in_half_l3(hidden)));
  return c;
}

int64_t flce_cpu_last_scratch_bytes() { return last_scratch_bytes; }

void fused_linear_cross_entropy_cpu(const Context&, const TensorView& loss,
                                    const TensorView& hidden, const TensorView& w,
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
    Scratch w_tile(p.meter, p.f32 ? 0 : p.chunks.vocab_rows * p.h);
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
          if (t == ignore_index) continue;
          const float* z = logits.get() + row * p.vocab;
          float lse = 0, mean_z = 0;
          stats_fn(z, p.vocab, &lse, &mean_z);
          losses[size_t(n)] = (1.0 - ls) * (double(lse) - z[t]) + ls * (double(lse) - mean_z);
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
    const TensorView& target, const TensorView& b, int64_t ignore_index, double label_smoothing,
    std::string_view reduction) {
  const Reduction r = parse_reduction(FusedLinearCrossEntropyBackward::name, reduction);
  Problem p(hidden, w, target, b, ignore_index, label_smoothing);
  const int64_t chunk = p.chunks.token_rows, tile = p.chunks.vocab_rows;
  const double scale = mean_scale(r, target, ignore_index);
  Scratch logits(p.meter, chunk * p.vocab);
  Scratch x_buf(p.meter, p.f32 ? 0 : chunk * p.h);
  Scratch w_tile(p.meter, p.f32 ? 0 : tile * p.h);
  Scratch dx_buf(p.meter, p.f32 ? 0 : chunk * p.h);
  Scratch dw_acc(p.meter, p.f32 ? 0 : p.vocab * p.h);
  Scratch db_acc(p.meter, p.vocab);
  float* dwp = p.f32 ? static_cast<float*>(dw.data) : dw_acc.get();
  const int64_t lddw = p.f32 ? dw.row_stride() : p.h;
  if (p.tokens == 0) gemm_cpu::sgemm(false, false, p.vocab, p.h, 0, nullptr, 1, nullptr, 1, 0.0f, dwp, lddw);
  std::fill(db_acc.get(), db_acc.get() + p.vocab, 0.0f);
  auto* stats_fn = HWY_DYNAMIC_DISPATCH(flce_cpu::row_stats);
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
        float lse = 0, mean_z = 0;
        stats_fn(z, p.vocab, &lse, &mean_z);
        grad_fn(z, p.vocab, lse, up, up * ls / float(p.vocab));
        z[t] -= up * (1.0f - ls);
      }
    });
    // db += column sums of G in row order.
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t v = 0; v < p.vocab; ++v) db_acc.get()[v] += g[row * p.vocab + v];
    // dhidden[chunk] = G @ w and dw += G^T @ hidden[chunk], tile by tile of w.
    float* dxp = p.f32 ? static_cast<float*>(dhidden.data) + n0 * dhidden.row_stride() : dx_buf.get();
    const int64_t lddx = p.f32 ? dhidden.row_stride() : p.h;
    for (int64_t v0 = 0; v0 < p.vocab; v0 += tile) {
      const int64_t v1 = std::min(p.vocab, v0 + tile);
      int64_t ldw = 0;
      const float* wt = w_rows(p, v0, v1, w_tile.get(), &ldw);
      gemm_cpu::sgemm(false, false, rows, p.h, v1 - v0, g + v0, p.vocab, wt, ldw,
                        v0 == 0 ? 0.0f : 1.0f, dxp, lddx);
      gemm_cpu::sgemm(true, false, v1 - v0, p.h, rows, g + v0, p.vocab, x, ldx,
                        n0 == 0 ? 0.0f : 1.0f, dwp + v0 * lddw, lddw);
    }
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

const char* fused_linear_cross_entropy_cpu_applicable(const TensorView&, const TensorView& hidden,
                                                      const TensorView& w, const TensorView&,
                                                      const TensorView&, int64_t, double,
                                                      std::string_view) {
  return flce_reason(hidden, w);
}

const char* fused_linear_cross_entropy_backward_cpu_applicable(
    const TensorView& dhidden, const TensorView& dw, const TensorView&, const TensorView&,
    const TensorView& hidden, const TensorView& w, const TensorView&, const TensorView&, int64_t,
    double, std::string_view) {
  if (const char* why = flce_reason(hidden, w)) return why;
  if (dhidden.row_stride() > int64_t(INT32_MAX) || dw.row_stride() > int64_t(INT32_MAX))
    return "a size exceeds the 32-bit BLAS interface";
  return nullptr;
}

}  // namespace opforge
#endif  // HWY_ONCE
