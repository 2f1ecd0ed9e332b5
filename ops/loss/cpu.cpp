// CPU kernels of the loss family: cross_entropy_cpu, kl_div_cpu, jsd_cpu, tvd_cpu and their
// backward kernels, and cross_entropy_with_grad_cpu.
//
// Assumes: [N, V] inputs with Note [row layout] rows, f32 / bf16 / f16 (f64 goes to the
// reference: the predicates say so), the op's check has run (targets in range, no overlaps).
//
// Why it is fast:
// - One Highway source, runtime ISA dispatch (4 f32 lanes on SSE4/NEON, 8 on AVX2, 16 on
//   AVX-512); bf16/f16 widened in registers, all math in f32, sums of blocks in double.
// - cross_entropy reads each row of logits from memory once: Note [online softmax blocks]
//   (ops/softmax/row_math-inl.h) widens an L1 block (softcapped with a vector tanh when asked),
//   takes its max, rescales the running sum once per block and sums exp(z - m) from L1: one
//   vector exp per element. The label-smoothing sum of z rides in the same sweep; z[target] is
//   one scalar load. Nothing else is written but the row's loss and lse.
// - cross_entropy_backward needs no max or sum: the saved lse gives p = exp(z - lse) directly,
//   so it is one sweep (read logits, write dlogits); the target entry is then recomputed alone
//   in f32 and stored, so p - 1 is not formed from a rounded bf16 value.
// - cross_entropy_with_grad runs both per row, the gradient sweep right after the row's
//   statistics, so its second read of the row comes from L1 / L2 (a 128k-vocab bf16 row is
//   256 KB) rather than memory: one read of the logits from memory, one write of dlogits.
//   Without smoothing or softcap the statistics sweep keeps its exps and the gradient is one
//   multiply an element (Note [fused exps]); that sweep prefetches the next row and, past the
//   cache share, writes dlogits by streaming stores (write_row, ops/softmax/row_math-inl.h).
// - kl_div, jsd, tvd: one sweep per row over both inputs with vector log / exp (exp_bounded,
//   log_normal_fast: no divide); reduced losses are per-row sums (f32 vectors per L1 block,
//   blocks in double) added in row order on the host: deterministic and independent of the
//   thread count.
// - OpenMP over tasks of rows sized by capacity_block (Note [tiling], L2); one task runs without
//   an OpenMP region.
//
// Measured (2026-11-26, 2-vCPU AMD EPYC VM, AVX2 target, shared with other builds, so CPU time of
// one thread is quoted; memcpy of the same bytes ran at ~19 GB/s read + write): 1024 x 32000 bf16
// cross_entropy 52 ms (1.26 GB/s, 11x the reference), f32 55 ms; PyTorch 2.15
// F.cross_entropy on the same thread 130 ms (bf16) / 150 ms (f32): 2.5-2.8x. With 2 threads
// (wall clock, loaded machine) 282 ms against PyTorch's 700-778 ms. The kernels are bound by the
// vector exp / log (about 1.5 ns per element per exp on this core), not by memory: tvd reaches
// 50% of the copy rate, cross_entropy 6%, jsd (two exps and a log) 3%.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/loss/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/loss/internal.h"
#include "ops/softmax/row_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::loss_simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// z = c * tanh(x / c) (softcap), or x.
template <bool kCap> struct Cap {
  float c = 0, inv_c = 0;
  HWY_INLINE VF operator()(VF x) const {
    if constexpr (!kCap) return x;
    const DF d;
    return hn::Mul(hn::Set(d, c), hn::Tanh(d, hn::Mul(x, hn::Set(d, inv_c))));
  }
  float scalar(float x) const { return kCap ? float(double(c) * std::tanh(double(x) / c)) : x; }
};

// Sum of exp(v - m) and of v over n f32 values.
HWY_INLINE std::pair<float, float> sum_exp_and_values(const float* v, int64_t n, float m) {
  const DF d;
  const VF vm = hn::Set(d, m);
  return sum_over2(n, [&](int64_t i, size_t count, VF& se, VF& sv) {
    const VF x = load_n(v + i, count);
    VF e = exp_bounded(hn::Sub(x, vm));
    if (count != hn::Lanes(d)) e = hn::IfThenElseZero(hn::FirstN(d, count), e);
    se = hn::Add(se, e);
    sv = hn::Add(sv, x);
  });
}

// One row's statistics: writes its lse and loss into a.row_lse / a.row_loss and returns the lse.
// Note [online softmax blocks] over L1 blocks widened into `scratch` (block + lanes floats).
template <class T, bool kCap>
HWY_INLINE float ce_row_stats(const CrossEntropyRows& a, const Cap<kCap>& cap, float* scratch, int64_t row) {
  const bool smoothing = a.label_smoothing > 0;
  const T* x = static_cast<const T*>(a.logits) + row * a.logits_stride;
  OnlineMaxSum stats;
  double sum_z = 0;
  for (int64_t b0 = 0; b0 < a.vocab; b0 += a.block) {
    const int64_t len = std::min(a.block, a.vocab - b0);
    const bool any = stats.raise_to(widen_max(x + b0, scratch, len, cap));
    if (smoothing) {
      const auto [se, sz] = sum_exp_and_values(scratch, len, stats.max);
      if (any) stats.sum += se;
      sum_z += sz;
    } else if (any) {
      stats.sum += sum_exp<false>(scratch, len, stats.max);
    }
  }
  const double lse = double(stats.max) + std::log(stats.sum);
  a.row_lse[row] = float(lse);
  const int64_t t = a.target[row * a.target_stride];
  if (t == a.ignore_index) {
    a.row_loss[row] = 0;
    return float(lse);
  }
  const double ls = a.label_smoothing, z_t = cap.scalar(float(x[t]));
  double l = (1 - ls) * (lse - z_t) + double(a.lse_square_scale) * lse * lse;
  if (smoothing) l += ls * lse - ls / double(a.vocab) * sum_z;
  a.row_loss[row] = l;
  return float(lse);
}

// One row's gradient from its lse and upstream gradient a.grad[row] into a.dlogits.
// kStream: dlogits by streaming stores (Note [streaming stores]), fenced before the target entry
// is written over its vector.
template <class T, bool kCap, bool kStream>
HWY_INLINE void ce_row_grad(const CrossEntropyRows& a, const Cap<kCap>& cap, int64_t row, float lse) {
  const DF d;
  const float eps = a.label_smoothing / float(a.vocab);
  const T* x = static_cast<const T*>(a.logits) + row * a.logits_stride;
  T* dx = static_cast<T*>(a.dlogits) + row * a.dlogits_stride;
  const int64_t t = a.target[row * a.target_stride];
  if (t == a.ignore_index) {
    write_row<kStream>(dx, a.vocab, kNone<T>, kNone<T>, [&](int64_t, size_t) { return hn::Zero(d); });
    return;
  }
  const float g = float(a.grad[row]);
  const float c1 = 1.0f + 2.0f * a.lse_square_scale * lse;
  const VF vp = hn::Set(d, g * c1), vb = hn::Set(d, -g * eps), vl = hn::Set(d, lse);
  const VF one = hn::Set(d, 1.0f), inv_c = hn::Set(d, cap.inv_c);
  // p below p_min would make g * c1 * p subnormal, which x86 cores compute through a slow
  // microcode assist: rows with an outlier logit (lse far above the rest) spent much of their time
  // there (cross_entropy_with_grad, 1024 x 32000 bf16 with the cases' 1% outliers, one thread on
  // the 2-vCPU EPYC VM: 44 ms, 30 ms with this flush). Such terms (< 1.2e-38) become 0, far below
  // any tolerance.
  const float gc = std::fabs(g * c1);
  const VF p_min = hn::Set(d, gc > 0 ? std::numeric_limits<float>::min() / gc : 0.0f);
  write_row<kStream>(dx, a.vocab, kNone<T>, kNone<T>, [&](int64_t i, size_t count) {
    const VF z = cap(load_n(x + i, count));
    const VF p = exp_bounded(hn::Sub(z, vl));
    VF dz = hn::MulAdd(vp, hn::IfThenZeroElse(hn::Lt(p, p_min), p), vb);
    if constexpr (kCap) {
      const VF r = hn::Mul(z, inv_c);
      dz = hn::Mul(dz, hn::NegMulAdd(r, r, one));
    }
    return dz;
  });
  if constexpr (kStream) hwy::FlushStream();
  // The target entry on its own: (p_t - eps - (1 - ls)) in f32, rounded once.
  const float z_t = cap.scalar(float(x[t]));
  float dz_t = g * (c1 * std::exp(z_t - lse) - eps - (1.0f - a.label_smoothing));
  if (kCap) dz_t *= 1.0f - (z_t * cap.inv_c) * (z_t * cap.inv_c);
  dx[t] = T(dz_t);
}

// Note [fused exps]: cross_entropy_with_grad without label smoothing or softcap keeps each
// block's exp(z - m_block) from the statistics sweep in a row-long f32 scratch (L2: 128 KB at a
// 32,000 vocabulary, 513 KB at 128,256), as softmax_row does, and the gradient sweep takes p =
// e exp(m_block - lse): one multiply an element where ce_row_grad takes a second exp. Its
// gradients then differ from cross_entropy_backward's in the last bits (p by another rounding),
// as the CUDA cluster kernel's do; loss and lse are the same bits. Rows with smoothing (sum z) or
// softcap (the derivative needs z) and rows with no finite logit take ce_row_stats + ce_row_grad.
template <class T, bool kStream>
HWY_INLINE void ce_row_fused(const CrossEntropyRows& a, float* row_exp, float* block_max, int64_t row,
                             const T* next_x) {
  const DF d;
  const Cap<false> cap{};
  const T* x = static_cast<const T*>(a.logits) + row * a.logits_stride;
  OnlineMaxSum stats;
  for (int64_t b0 = 0, b = 0; b0 < a.vocab; b0 += a.block, ++b) {
    const int64_t len = std::min(a.block, a.vocab - b0);
    block_max[b] = kNegInf;
    if (!stats.raise_to(widen_max(x + b0, row_exp + b0, len, cap))) continue;
    block_max[b] = stats.max;
    stats.sum += sum_exp<true>(row_exp + b0, len, stats.max);
  }
  const double lse = double(stats.max) + std::log(stats.sum);
  if (!std::isfinite(lse)) {  // no finite logit (or an infinite one): the two-exp path's values
    ce_row_grad<T, false, kStream>(a, cap, row, ce_row_stats<T, false>(a, cap, row_exp, row));
    return;
  }
  a.row_lse[row] = float(lse);
  const int64_t t = a.target[row * a.target_stride];
  T* dx = static_cast<T*>(a.dlogits) + row * a.dlogits_stride;
  if (t == a.ignore_index) {
    a.row_loss[row] = 0;
    write_row<kStream>(dx, a.vocab, next_x, kNone<T>, [&](int64_t, size_t) { return hn::Zero(d); });
    return;
  }
  const double z_t = double(float(x[t]));
  a.row_loss[row] = (lse - z_t) + double(a.lse_square_scale) * lse * lse;
  const float g = float(a.grad[row]), lse_f = float(lse);
  const float c1 = 1.0f + 2.0f * a.lse_square_scale * lse_f;
  const VF vp = hn::Set(d, g * c1), vb = hn::Zero(d);
  const float gc = std::fabs(g * c1);  // the subnormal flush of ce_row_grad
  const VF p_min = hn::Set(d, gc > 0 ? std::numeric_limits<float>::min() / gc : 0.0f);
  for (int64_t b0 = 0, b = 0; b0 < a.vocab; b0 += a.block, ++b) {
    const int64_t len = std::min(a.block, a.vocab - b0);
    const float* e = row_exp + b0;
    const T* next = next_x ? next_x + b0 : nullptr;
    if (block_max[b] == kNegInf) {  // every logit of the block -inf: p = 0
      write_row<kStream>(dx + b0, len, next, kNone<T>, [&](int64_t, size_t) { return vb; });
      continue;
    }
    const VF factor = hn::Set(d, float(std::exp(double(block_max[b]) - lse)));
    write_row<kStream>(dx + b0, len, next, kNone<T>, [&](int64_t i, size_t count) {
      const VF p = hn::Mul(load_n(e + i, count), factor);
      return hn::MulAdd(vp, hn::IfThenZeroElse(hn::Lt(p, p_min), p), vb);
    });
  }
  if constexpr (kStream) hwy::FlushStream();
  // The target entry as ce_row_grad's: (p_t - 1) in f32, rounded once.
  dx[t] = T(g * (c1 * std::exp(float(z_t) - lse_f) - 1.0f));
}

// Rows [begin, end): statistics (forward), the gradient from the saved lse (backward), or both
// per row (fused: the gradient sweep reads the row again while it is still in L1 / L2; Note
// [fused exps]).
template <class T, bool kCap, bool kStream>
void ce_sweep_rows(const CrossEntropyRows& a, CeSweep sweep, int64_t begin, int64_t end) {
  const Cap<kCap> cap{a.softcap, a.softcap > 0 ? 1.0f / a.softcap : 0.0f};
  const int64_t lanes = int64_t(hn::Lanes(DF()));
  std::unique_ptr<float[]> scratch;
  if (sweep != CeSweep::backward) scratch.reset(new float[size_t(a.block + lanes)]);
  if constexpr (!kCap) {
    if (sweep == CeSweep::fused && a.label_smoothing == 0) {  // Note [fused exps]
      const int64_t blocks = (a.vocab + a.block - 1) / a.block;
      std::unique_ptr<float[]> row_exp(new float[size_t(a.vocab + a.block + lanes)]);
      std::unique_ptr<float[]> block_max(new float[size_t(std::max<int64_t>(blocks, 1))]);
      const T* logits = static_cast<const T*>(a.logits);
      for (int64_t row = begin; row < end; ++row) {
        const T* next_x = row + 1 < end ? logits + (row + 1) * a.logits_stride : nullptr;
        ce_row_fused<T, kStream>(a, row_exp.get(), block_max.get(), row, next_x);
      }
      if constexpr (kStream) hwy::FlushStream();
      return;
    }
  }
  for (int64_t row = begin; row < end; ++row) {
    if (sweep == CeSweep::backward) {
      ce_row_grad<T, kCap, kStream>(a, cap, row, a.lse[row]);
      continue;
    }
    const float lse = ce_row_stats<T, kCap>(a, cap, scratch.get(), row);
    if (sweep == CeSweep::fused) ce_row_grad<T, kCap, kStream>(a, cap, row, lse);
  }
  if constexpr (kStream) hwy::FlushStream();
}

// ---- kl_div / jsd / tvd -------------------------------------------------------------------------
// exp of a log-probability (<= 0 for valid inputs): exp_bounded, with inputs clamped to 88 so
// that invalid ones give a large finite value rather than a wrapped exponent.
HWY_INLINE VF exp_of_log_prob(VF x) { return exp_bounded(hn::Min(x, hn::Set(DF(), 88.0f))); }

// Element loss (forward) or its derivative by a (backward) of one vector of (a, b).
template <PairLoss kKind, bool kBackward>
HWY_INLINE VF pair_elem(VF a, VF b, float eps, float beta) {
  const DF d;
  const VF half = hn::Set(d, 0.5f);
  if constexpr (kKind == PairLoss::kl_div) {  // a = y_pred, b = y_true
    if constexpr (kBackward) return hn::Neg(b);
    return hn::Mul(b, hn::Sub(log_normal_fast(hn::Max(b, hn::Set(d, eps))), a));
  } else if constexpr (kKind == PairLoss::kl_div_log_target) {
    const VF p = exp_of_log_prob(b);
    if constexpr (kBackward) return hn::Neg(p);
    return hn::Mul(p, hn::Sub(b, a));
  } else if constexpr (kKind == PairLoss::tvd) {
    if constexpr (kBackward) return hn::IfThenElse(hn::Gt(a, b), half, hn::Neg(half));
    return hn::Mul(half, hn::Abs(hn::Sub(a, b)));
  } else {  // jsd: a = X = log Q, b = Y = log P
    if (beta == 0.0f) {
      const VF p = exp_of_log_prob(b);
      if constexpr (kBackward) return hn::Neg(p);
      return hn::Mul(p, hn::Sub(b, a));
    }
    const VF q = exp_of_log_prob(a);
    if (beta == 1.0f) {
      const VF diff = hn::Sub(a, b);
      if constexpr (kBackward) return hn::MulAdd(q, diff, q);
      return hn::Mul(q, diff);
    }
    const VF vb = hn::Set(d, beta), vb1 = hn::Set(d, 1.0f - beta);
    const VF bp = hn::Mul(vb, exp_of_log_prob(b)), cq = hn::Mul(vb1, q);
    const VF m = hn::Add(bp, cq), log_m = log_normal_fast(m);
    if constexpr (kBackward) return hn::Mul(cq, hn::Sub(a, log_m));
    return hn::NegMulAdd(m, log_m, hn::MulAdd(bp, b, hn::Mul(cq, a)));
  }
}

template <class T, PairLoss kKind>
void pair_rows_typed(const PairRows& p, int64_t begin, int64_t end) {
  const DF d;
  for (int64_t row = begin; row < end; ++row) {
    const T* a = static_cast<const T*>(p.a) + row * p.a_stride;
    const T* b = static_cast<const T*>(p.b) + row * p.b_stride;
    T* out = p.out ? static_cast<T*>(p.out) + row * p.out_stride : nullptr;
    if (!p.kept[row]) {
      if (out) for_each_vector(p.vocab, [&](int64_t i, size_t count) { store_n(hn::Zero(d), out + i, count); });
      else p.row_sum[row] = 0;
      continue;
    }
    if (p.backward) {
      const T* dl = p.dloss ? static_cast<const T*>(p.dloss) + row * p.dloss_stride : nullptr;
      const VF g = hn::Set(d, p.dloss ? 1.0f : float(p.grad[row]));
      for_each_vector(p.vocab, [&](int64_t i, size_t count) {
        VF v = hn::Mul(g, pair_elem<kKind, true>(load_n(a + i, count), load_n(b + i, count), p.eps, p.beta));
        if (dl) v = hn::Mul(v, load_n(dl + i, count));
        store_n(v, out + i, count);
      });
    } else if (out) {
      for_each_vector(p.vocab, [&](int64_t i, size_t count) {
        store_n(pair_elem<kKind, false>(load_n(a + i, count), load_n(b + i, count), p.eps, p.beta),
                out + i, count);
      });
    } else {
      p.row_sum[row] = sum_blocks(p.vocab, p.block, [&](int64_t i, size_t count, VF& acc) {
        VF v = pair_elem<kKind, false>(load_n(a + i, count), load_n(b + i, count), p.eps, p.beta);
        if (count != hn::Lanes(d)) v = hn::IfThenElseZero(hn::FirstN(d, count), v);
        acc = hn::Add(acc, v);
      });
    }
  }
}

template <class T> void pair_rows_for(const PairRows& p, int64_t begin, int64_t end) {
  switch (p.kind) {
    case PairLoss::kl_div: return pair_rows_typed<T, PairLoss::kl_div>(p, begin, end);
    case PairLoss::kl_div_log_target: return pair_rows_typed<T, PairLoss::kl_div_log_target>(p, begin, end);
    case PairLoss::jsd: return pair_rows_typed<T, PairLoss::jsd>(p, begin, end);
    case PairLoss::tvd: return pair_rows_typed<T, PairLoss::tvd>(p, begin, end);
  }
}

void pair_rows(const PairRows& p, int64_t begin, int64_t end) {
  switch (p.dtype) {
    case DType::bf16: return pair_rows_for<bf16_t>(p, begin, end);
    case DType::f16: return pair_rows_for<f16_t>(p, begin, end);
    default: return pair_rows_for<float>(p, begin, end);
  }
}

template <class T, bool kStream>
void ce_rows_streamed(const CrossEntropyRows& a, CeSweep sweep, int64_t begin, int64_t end) {
  if (a.softcap > 0) ce_sweep_rows<T, true, kStream>(a, sweep, begin, end);
  else ce_sweep_rows<T, false, kStream>(a, sweep, begin, end);
}

template <class T>
void ce_rows_for(const CrossEntropyRows& a, CeSweep sweep, int64_t begin, int64_t end) {
  if (a.stream) ce_rows_streamed<T, true>(a, sweep, begin, end);  // set by cross_entropy_with_grad only
  else ce_rows_streamed<T, false>(a, sweep, begin, end);
}

void ce_rows(const CrossEntropyRows& a, CeSweep sweep, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return ce_rows_for<bf16_t>(a, sweep, begin, end);
    case DType::f16: return ce_rows_for<f16_t>(a, sweep, begin, end);
    default: return ce_rows_for<float>(a, sweep, begin, end);
  }
}

}  // namespace opforge::loss_simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace loss_simd {
HWY_EXPORT(ce_rows);
HWY_EXPORT(pair_rows);
}  // namespace loss_simd

namespace {

// Rows per task (Note [tiling], L2) with `tensors` [N, V] tensors of x's dtype per element.
cpu::RowTasks row_tasks(const TensorView& x, int64_t tensors) {
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors * x.itemsize();
  spec.multiplier = std::max<int64_t>(x.size(1), 1);
  return {x.size(0), cpu::capacity_block(spec)};
}

// The L1 block of Note [online softmax blocks]: the block's input and its f32 copy.
int64_t l1_block(const TensorView& x) {
  cpu::TileSpec spec;
  spec.bytes_per_element = x.itemsize() + int64_t(sizeof(float));
  spec.level = cpu::CacheLevel::l1d;
  return std::max<int64_t>(cpu::capacity_block(spec), 64);
}

double value_at(const TensorView& t, int64_t i) { return load_as_double(t.data, t.dtype, i * t.stride(0)); }

template <class F> void run_tasks(const cpu::RowTasks& tasks, F&& f) {
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { f(tasks.begin(t), tasks.end(t)); });
}

CrossEntropyRows ce_rows_of(const TensorView& logits, const TensorView& target,
                            int64_t ignore_index, double label_smoothing,
                            double lse_square_scale, double softcap) {
  CrossEntropyRows a;
  a.dtype = logits.dtype;
  a.vocab = logits.size(1);
  a.block = l1_block(logits);
  a.logits = logits.data;
  a.logits_stride = logits.row_stride();
  a.target = target.ptr<const int64_t>();
  a.target_stride = target.stride(0);
  a.ignore_index = ignore_index;
  a.label_smoothing = float(label_smoothing);
  a.lse_square_scale = float(lse_square_scale);
  a.softcap = float(softcap);
  return a;
}

// cross_entropy's loss output from the per-row losses: as they are (none), their sum, or their
// sum over the rows not ignored (mean; 0 such rows give NaN).
void store_ce_loss(const TensorView& loss, const std::vector<double>& row_loss, const TensorView& target,
                   int64_t ignore_index, Reduction r) {
  const int64_t rows = int64_t(row_loss.size());
  if (r == Reduction::none) {
    for (int64_t row = 0; row < rows; ++row) store_from_double(loss.data, loss.dtype, row * loss.stride(0), row_loss[size_t(row)]);
    return;
  }
  double total = 0;
  for (double l : row_loss) total += l;
  if (r == Reduction::mean) total /= double(kept_rows(target, rows, ignore_index));
  store_from_double(loss.data, loss.dtype, 0, total);
}

// The upstream gradient of each row: dloss[row] (none), dloss[0] (sum), dloss[0] / rows not
// ignored (mean).
std::vector<double> ce_row_grads(const TensorView& dloss, const TensorView& target, int64_t ignore_index,
                                 int64_t rows, Reduction r) {
  std::vector<double> grad(static_cast<size_t>(rows));
  const double divisor = r == Reduction::mean ? double(kept_rows(target, rows, ignore_index)) : 1.0;
  for (int64_t row = 0; row < rows; ++row)
    grad[size_t(row)] = r == Reduction::none ? value_at(dloss, row) : value_at(dloss, 0) / divisor;
  return grad;
}

// kept[row] = 1 unless labels[row] == ignore_index; returns the count.
int64_t kept_flags(const TensorView& labels, int64_t rows, int64_t ignore_index,
                   std::vector<uint8_t>& kept) {
  kept.assign(size_t(rows), 1);
  int64_t n = 0;
  for (int64_t row = 0; row < rows; ++row) n += kept[size_t(row)] = row_kept(labels, row, ignore_index);
  return n;
}

// Forward of kl_div / jsd / tvd: element losses into `loss` (none) or the reduced loss.
void pair_forward(PairLoss kind, const TensorView& loss, const TensorView& a, const TensorView& b,
                  const TensorView& labels, int64_t ignore_index, Reduction r, float eps,
                  float beta) {
  const int64_t rows = a.size(0), vocab = a.size(1);
  std::vector<uint8_t> kept;
  const int64_t n_kept = kept_flags(labels, rows, ignore_index, kept);
  std::vector<double> row_sum(size_t(rows), 0.0);
  PairRows p{kind, a.dtype, vocab, l1_block(a), eps, beta, a.data, a.row_stride(), b.data, b.row_stride(), kept.data()};
  if (r == Reduction::none) {
    p.out = loss.data;
    p.out_stride = loss.row_stride();
  } else {
    p.row_sum = row_sum.data();
  }
  auto* fn = HWY_DYNAMIC_DISPATCH(loss_simd::pair_rows);
  run_tasks(row_tasks(a, 3), [&](int64_t begin, int64_t end) { fn(p, begin, end); });
  if (r == Reduction::none) return;
  double total = 0;
  for (double s : row_sum) total += s;
  store_from_double(loss.data, loss.dtype, 0, total / reduction_divisor(r, n_kept, vocab));
}

void pair_backward(PairLoss kind, const TensorView& grad, const TensorView& dloss,
                   const TensorView& a, const TensorView& b, const TensorView& labels,
                   int64_t ignore_index, Reduction r, float eps, float beta) {
  const int64_t rows = b.size(0), vocab = b.size(1);
  std::vector<uint8_t> kept;
  const int64_t n_kept = kept_flags(labels, rows, ignore_index, kept);
  std::vector<double> row_grad;
  PairRows p{kind, b.dtype, vocab, l1_block(b), eps, beta, a.data, a.row_stride(), b.data, b.row_stride(), kept.data()};
  p.backward = true;
  p.out = grad.data;
  p.out_stride = grad.row_stride();
  if (r == Reduction::none) {
    p.dloss = dloss.data;
    p.dloss_stride = dloss.row_stride();
  } else {
    row_grad.assign(size_t(rows), value_at(dloss, 0) / reduction_divisor(r, n_kept, vocab));
    p.grad = row_grad.data();
  }
  auto* fn = HWY_DYNAMIC_DISPATCH(loss_simd::pair_rows);
  run_tasks(row_tasks(b, 4), [&](int64_t begin, int64_t end) { fn(p, begin, end); });
}

}  // namespace

const char* loss_cpu_reason(const TensorView& x) {
  if (!x.device.is_cpu()) return "tensors are not on the cpu";
  switch (x.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

void cross_entropy_cpu(const Context&, const TensorView& loss, const TensorView& lse,
                       const TensorView& logits, const TensorView& target, int64_t ignore_index,
                       double label_smoothing, double lse_square_scale, double softcap,
                       std::string_view reduction) {
  CrossEntropyRows a = ce_rows_of(logits, target, ignore_index, label_smoothing, lse_square_scale, softcap);
  std::vector<double> row_loss(static_cast<size_t>(logits.size(0)));
  a.row_loss = row_loss.data();
  a.row_lse = lse.ptr<float>();  // lse is f32 for the dtypes of this kernel (Note [loss outputs])
  auto* fn = HWY_DYNAMIC_DISPATCH(loss_simd::ce_rows);
  run_tasks(row_tasks(logits, 1), [&](int64_t begin, int64_t end) { fn(a, CeSweep::forward, begin, end); });
  store_ce_loss(loss, row_loss, target, ignore_index, reduction_of(reduction));
}

void cross_entropy_backward_cpu(const Context&, const TensorView& dlogits, const TensorView& dloss,
                                const TensorView& logits, const TensorView& target,
                                const TensorView& lse, int64_t ignore_index,
                                double label_smoothing, double lse_square_scale, double softcap,
                                std::string_view reduction) {
  const int64_t rows = logits.size(0);
  CrossEntropyRows a = ce_rows_of(logits, target, ignore_index, label_smoothing, lse_square_scale, softcap);
  std::vector<float> lse_f(static_cast<size_t>(rows));
  for (int64_t row = 0; row < rows; ++row) lse_f[size_t(row)] = float(value_at(lse, row));
  const std::vector<double> grad = ce_row_grads(dloss, target, ignore_index, rows, reduction_of(reduction));
  a.lse = lse_f.data();
  a.grad = grad.data();
  a.dlogits = dlogits.data;
  a.dlogits_stride = dlogits.row_stride();
  // Plain stores: streaming dlogits measured slower in this one-sweep kernel (bf16 1,024 x 32,000
  // on the 2-core EPYC: 6.7-7.6 -> 7.4-9.0 ms, docs/perf/cpu.md); the fused op's gradient sweep,
  // which reads only cache, gains from them.
  auto* fn = HWY_DYNAMIC_DISPATCH(loss_simd::ce_rows);
  run_tasks(row_tasks(logits, 2), [&](int64_t begin, int64_t end) { fn(a, CeSweep::backward, begin, end); });
}

void cross_entropy_with_grad_cpu(const Context&, const TensorView& loss, const TensorView& lse,
                                 const TensorView& dlogits, const TensorView& logits,
                                 const TensorView& target, const TensorView& dloss,
                                 int64_t ignore_index, double label_smoothing,
                                 double lse_square_scale, double softcap,
                                 std::string_view reduction) {
  const Reduction r = reduction_of(reduction);
  CrossEntropyRows a = ce_rows_of(logits, target, ignore_index, label_smoothing, lse_square_scale, softcap);
  std::vector<double> row_loss(static_cast<size_t>(logits.size(0)));
  const std::vector<double> grad = ce_row_grads(dloss, target, ignore_index, logits.size(0), r);
  a.row_loss = row_loss.data();
  a.row_lse = lse.ptr<float>();
  a.grad = grad.data();
  a.dlogits = dlogits.data;
  a.dlogits_stride = dlogits.row_stride();
  a.stream = cpu::stream_outputs(2 * bytes_of(logits), {&dlogits});
  auto* fn = HWY_DYNAMIC_DISPATCH(loss_simd::ce_rows);
  run_tasks(row_tasks(logits, 2), [&](int64_t begin, int64_t end) { fn(a, CeSweep::fused, begin, end); });
  store_ce_loss(loss, row_loss, target, ignore_index, r);
}

void kl_div_cpu(const Context&, const TensorView& loss, const TensorView& y_pred,
                const TensorView& y_true, bool log_target, std::string_view reduction, double eps) {
  pair_forward(log_target ? PairLoss::kl_div_log_target : PairLoss::kl_div, loss, y_pred, y_true,
               TensorView{}, 0, reduction_of(reduction), float(eps), 0);
}

void kl_div_backward_cpu(const Context&, const TensorView& dy_pred, const TensorView& dloss,
                         const TensorView& y_true, bool log_target, std::string_view reduction,
                         double eps) {
  // The gradient depends on y_true alone; y_true also stands in for the unused y_pred.
  pair_backward(log_target ? PairLoss::kl_div_log_target : PairLoss::kl_div, dy_pred, dloss,
                y_true, y_true, TensorView{}, 0, reduction_of(reduction), float(eps), 0);
}

void jsd_cpu(const Context&, const TensorView& loss, const TensorView& input,
             const TensorView& target, const TensorView& labels, double beta,
             int64_t ignore_index) {
  pair_forward(PairLoss::jsd, loss, input, target, labels, ignore_index, Reduction::batchmean, 0,
               float(beta));
}

void jsd_backward_cpu(const Context&, const TensorView& dinput, const TensorView& dloss,
                      const TensorView& input, const TensorView& target, const TensorView& labels,
                      double beta, int64_t ignore_index) {
  pair_backward(PairLoss::jsd, dinput, dloss, input, target, labels, ignore_index,
                Reduction::batchmean, 0, float(beta));
}

void tvd_cpu(const Context&, const TensorView& loss, const TensorView& p, const TensorView& q,
             const TensorView& labels, std::string_view reduction, int64_t ignore_index) {
  pair_forward(PairLoss::tvd, loss, p, q, labels, ignore_index, reduction_of(reduction), 0, 0);
}

void tvd_backward_cpu(const Context&, const TensorView& dp, const TensorView& dloss,
                      const TensorView& p, const TensorView& q, const TensorView& labels,
                      std::string_view reduction, int64_t ignore_index) {
  pair_backward(PairLoss::tvd, dp, dloss, p, q, labels, ignore_index, reduction_of(reduction), 0, 0);
}

}  // namespace opforge
#endif  // HWY_ONCE
