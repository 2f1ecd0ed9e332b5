// CUDA kernels of the loss family (cross_entropy: ops/loss/cuda.cu; cross_entropy_with_grad:
// ops/loss/cuda_fused.cu; kl_div, jsd, tvd: ops/loss/cuda_divergence.cu), declared for registration
// and for tests that call them directly. Two kernels per op (cross_entropy_with_grad: three, below):
//   <op>_cuda        any layout the op's check accepts (scalar loads); predicate: dtypes only
//   <op>_cuda_vec16  16-byte packs; predicate: alignment, V and row strides multiples of the pack
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "ops/loss/loss.h"

namespace opforge {

void cross_entropy_cuda(const Context&, const TensorView& loss, const TensorView& lse, const TensorView& logits,
                        const TensorView& target, int64_t ignore_index, double label_smoothing,
                        double lse_square_scale, double softcap, std::string_view reduction);
void cross_entropy_cuda_vec16(const Context&, const TensorView& loss, const TensorView& lse,
                              const TensorView& logits, const TensorView& target, int64_t ignore_index,
                              double label_smoothing, double lse_square_scale, double softcap,
                              std::string_view reduction);
const char* cross_entropy_cuda_applicable(const TensorView& loss, const TensorView& lse, const TensorView& logits,
                                          const TensorView& target, int64_t ignore_index, double label_smoothing,
                                          double lse_square_scale, double softcap, std::string_view reduction);
const char* cross_entropy_cuda_vec16_applicable(const TensorView& loss, const TensorView& lse,
                                                const TensorView& logits, const TensorView& target,
                                                int64_t ignore_index, double label_smoothing,
                                                double lse_square_scale, double softcap,
                                                std::string_view reduction);

void cross_entropy_backward_cuda(const Context&, const TensorView& dlogits, const TensorView& dloss,
                                 const TensorView& logits, const TensorView& target, const TensorView& lse,
                                 int64_t ignore_index, double label_smoothing, double lse_square_scale,
                                 double softcap, std::string_view reduction);
void cross_entropy_backward_cuda_vec16(const Context&, const TensorView& dlogits, const TensorView& dloss,
                                       const TensorView& logits, const TensorView& target, const TensorView& lse,
                                       int64_t ignore_index, double label_smoothing, double lse_square_scale,
                                       double softcap, std::string_view reduction);
const char* cross_entropy_backward_cuda_applicable(const TensorView& dlogits, const TensorView& dloss,
                                                   const TensorView& logits, const TensorView& target,
                                                   const TensorView& lse, int64_t ignore_index,
                                                   double label_smoothing, double lse_square_scale,
                                                   double softcap, std::string_view reduction);
const char* cross_entropy_backward_cuda_vec16_applicable(const TensorView& dlogits, const TensorView& dloss,
                                                         const TensorView& logits, const TensorView& target,
                                                         const TensorView& lse, int64_t ignore_index,
                                                         double label_smoothing, double lse_square_scale,
                                                         double softcap, std::string_view reduction);

// cross_entropy_with_grad (ops/loss/cuda_fused.cu), three kernels:
//   _cuda_cluster_vec16  one read of each row: a thread-block cluster holds the row in shared
//                        memory (Note [ce with grad clusters]); 16-byte packs; up to 64 rows,
//                        in registers (Note [ce with grad, rows in registers])
//   _cuda_cluster        the same with single elements (any layout the check accepts)
//   _cuda                cross_entropy's then cross_entropy_backward's kernels (two reads of the
//                        logits): any row length, no cluster needed
void cross_entropy_with_grad_cuda(const Context&, const TensorView& loss, const TensorView& lse,
                                  const TensorView& dlogits, const TensorView& logits, const TensorView& target,
                                  const TensorView& dloss, int64_t ignore_index, double label_smoothing,
                                  double lse_square_scale, double softcap, std::string_view reduction);
void cross_entropy_with_grad_cuda_cluster(const Context&, const TensorView& loss, const TensorView& lse,
                                          const TensorView& dlogits, const TensorView& logits,
                                          const TensorView& target, const TensorView& dloss, int64_t ignore_index,
                                          double label_smoothing, double lse_square_scale, double softcap,
                                          std::string_view reduction);
void cross_entropy_with_grad_cuda_cluster_vec16(const Context&, const TensorView& loss, const TensorView& lse,
                                                const TensorView& dlogits, const TensorView& logits,
                                                const TensorView& target, const TensorView& dloss,
                                                int64_t ignore_index, double label_smoothing,
                                                double lse_square_scale, double softcap,
                                                std::string_view reduction);
const char* cross_entropy_with_grad_cuda_applicable(const TensorView& loss, const TensorView& lse,
                                                    const TensorView& dlogits, const TensorView& logits,
                                                    const TensorView& target, const TensorView& dloss,
                                                    int64_t ignore_index, double label_smoothing,
                                                    double lse_square_scale, double softcap,
                                                    std::string_view reduction);
const char* cross_entropy_with_grad_cuda_cluster_applicable(const TensorView& loss, const TensorView& lse,
                                                            const TensorView& dlogits, const TensorView& logits,
                                                            const TensorView& target, const TensorView& dloss,
                                                            int64_t ignore_index, double label_smoothing,
                                                            double lse_square_scale, double softcap,
                                                            std::string_view reduction);
const char* cross_entropy_with_grad_cuda_cluster_vec16_applicable(
    const TensorView& loss, const TensorView& lse, const TensorView& dlogits, const TensorView& logits,
    const TensorView& target, const TensorView& dloss, int64_t ignore_index, double label_smoothing,
    double lse_square_scale, double softcap, std::string_view reduction);

// Note [ce with grad clusters]: how cross_entropy_with_grad's cluster kernels cut a row of `vocab`
// elements of `itemsize` bytes, read `unit` elements at a time (8 or 4 for 16-byte packs, 1 for
// single elements), over the CTAs of a cluster (plain host arithmetic, so tests run it without a
// GPU). The row must sit in the cluster's shared memory: `cluster` CTAs (1 to 8: 8 is the portable
// maximum; any count, so slices come close to the target) of `slice` elements each, a multiple of
// `unit`. The smallest cluster whose
// slice fits `target_bytes` (what leaves room for three CTAs per SM: their phases, copy in,
// reduce, write out, then overlap) wins; else the smallest whose slice fits `optin_bytes` (a CTA's
// most dynamic shared memory); else none (cluster 0, `why` says so). `forced` (1 to 8; 0 for
// none; OPFORGE_CE_GRAD_CLUSTER in the kernels) takes that cluster size when its slice fits
// `optin_bytes`, as a tuning override. compute capability < 9.0 has no clusters: cluster 0.
struct CeGradClusterPlan {
  int cluster = 0;           // CTAs per row; 0: no cluster kernel for this row
  int64_t slice = 0;         // elements of the row per CTA
  int64_t smem_bytes = 0;    // dynamic shared memory per CTA
  const char* why = nullptr;  // when cluster == 0
};
inline CeGradClusterPlan ce_grad_cluster_plan(int64_t vocab, int64_t itemsize, int64_t unit, int cc_major,
                                              int64_t optin_bytes, int64_t target_bytes, int forced = 0) {
  CeGradClusterPlan plan;
  if (cc_major < 9) {
    plan.why = "compute capability below 9.0: no thread-block clusters";
    return plan;
  }
  const int64_t units = (vocab + unit - 1) / unit;
  auto slice_of = [&](int c) { return (units + c - 1) / c * unit; };
  auto take = [&](int c) {
    plan.cluster = c;
    plan.slice = slice_of(c);
    plan.smem_bytes = (plan.slice * itemsize + 15) / 16 * 16;
    return plan;
  };
  if (forced >= 1 && forced <= 8)
    if (slice_of(forced) * itemsize <= optin_bytes) return take(forced);
  for (int c = 1; c <= 8; ++c)
    if (slice_of(c) * itemsize <= target_bytes) return take(c);
  for (int c = 1; c <= 8; ++c)
    if (slice_of(c) * itemsize <= optin_bytes) return take(c);
  plan.why = "a row does not fit in the shared memory of a cluster of 8 CTAs";
  return plan;
}

// Note [ce with grad, rows in registers] (ops/loss/cuda_ce_grad_few.cu): cross_entropy_with_grad of
// up to kCeGradFewRows rows of 16-byte packs in one register-resident cluster launch; false when it
// does not take the call (OPFORGE_CE_GRAD_REGISTERS=0, a reduction other than none, too many rows,
// a row longer than 8 CTAs of 8 packs a thread, no clusters). The caller has checked the vec16
// layouts.
bool ce_grad_few_rows_cuda(const Context& ctx, const TensorView& loss, const TensorView& lse,
                           const TensorView& dlogits, const TensorView& logits, const TensorView& target,
                           const TensorView& dloss, int64_t ignore_index, double label_smoothing,
                           double lse_square_scale, double softcap, std::string_view reduction);
// Whether cross_entropy's forward with a sum or mean reduction runs these logits (16-byte packs)
// through Note [few-row cross_entropy gather] (ops/loss/cuda.cu).
bool ce_forward_gathers(const TensorView& logits);

// Note [ce with grad, few rows] (ops/loss/cuda_fused.cu): up to kCeGradFewRows rows a call is one
// launch (each CTA counts a mean's kept rows, one target a thread; the last row adds the losses),
// and the cluster grows from the plan's `cluster` to as many CTAs as fill `sms` SMs, at most 8.
// A larger cluster needs its slices to fit too: the caller re-plans with the returned size forced.
inline constexpr int64_t kCeGradFewRows = 64;
inline int ce_grad_few_row_cluster(int64_t rows, int sms, int cluster) {
  if (rows <= 0 || rows > kCeGradFewRows || cluster <= 0) return cluster;
  const int64_t fill = std::clamp<int64_t>(int64_t(sms) / rows, 1, 8);
  return int(std::max<int64_t>(fill, cluster));
}
// Few short rows without a softcap or label smoothing (at most kCeGradTwoPassElements logits) run
// faster as cross_entropy's kernel then cross_entropy_backward's than as the one-read cluster
// kernel (measured on an H200, docs/perf/gpu-h200-2026-11-30-round32.md).
inline constexpr int64_t kCeGradTwoPassElements = int64_t(1) << 20;
inline bool ce_grad_two_passes_faster(int64_t rows, int64_t vocab, double label_smoothing, double softcap) {
  return rows > 0 && rows <= kCeGradFewRows && label_smoothing == 0.0 && softcap == 0.0 &&
         rows * vocab <= kCeGradTwoPassElements;
}

// cross_entropy_with_grad's exp-once cluster kernel (Note [ce with grad, exp once]) over rows of f32
// logits already in device memory: fused_linear_cross_entropy_with_grad's token blocks
// (ops/linear/flce_cuda.cu). Writes lse and loss per row and the gradient g (softmax - (1 - ls)
// onehot - ls / V), g = up[row * up_stride] (0 for an ignored row), no z-loss or softcap. `grad`
// may hold the gradient in place of the logits, row by row (grad row r starting where logits row r
// starts, grad_ld elements of grad_dtype apart): a cluster has its whole row in shared memory
// before any gradient is written. Needs vocab and ld multiples of 4 and 16-byte aligned rows.
struct CeGradRows {
  const float* logits;
  int64_t ld;
  void* grad;
  DType grad_dtype;
  int64_t grad_ld;
  int64_t rows, vocab;
  const int64_t* target;
  int64_t target_stride;
  const void* up;
  DType up_dtype;
  int64_t up_stride;
  float* loss;
  int64_t loss_stride;
  float* lse;
  int64_t lse_stride;
  int64_t ignore_index;
  float smoothing;
};
// Whether ce_grad_rows can run rows of `vocab` f32 logits writing `grad_dtype` on ctx's device (a
// cluster that holds a row and can be co-scheduled).
bool ce_grad_rows_fit(const Context& ctx, int64_t vocab, DType grad_dtype);
void ce_grad_rows(const Context& ctx, const CeGradRows& rows);

// kl_div, jsd, tvd and their backward ops (ops/loss/cuda_divergence.cu), same two kernels per op.
void kl_div_cuda(const Context&, const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                 bool log_target, std::string_view reduction, double eps);
void kl_div_cuda_vec16(const Context&, const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                       bool log_target, std::string_view reduction, double eps);
const char* kl_div_cuda_applicable(const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                                   bool log_target, std::string_view reduction, double eps);
const char* kl_div_cuda_vec16_applicable(const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                                         bool log_target, std::string_view reduction, double eps);

void kl_div_backward_cuda(const Context&, const TensorView& dy_pred, const TensorView& dloss,
                          const TensorView& y_true, bool log_target, std::string_view reduction, double eps);
void kl_div_backward_cuda_vec16(const Context&, const TensorView& dy_pred, const TensorView& dloss,
                                const TensorView& y_true, bool log_target, std::string_view reduction, double eps);
const char* kl_div_backward_cuda_applicable(const TensorView& dy_pred, const TensorView& dloss,
                                            const TensorView& y_true, bool log_target, std::string_view reduction,
                                            double eps);
const char* kl_div_backward_cuda_vec16_applicable(const TensorView& dy_pred, const TensorView& dloss,
                                                  const TensorView& y_true, bool log_target,
                                                  std::string_view reduction, double eps);

void jsd_cuda(const Context&, const TensorView& loss, const TensorView& input, const TensorView& target,
              const TensorView& labels, double beta, int64_t ignore_index);
void jsd_cuda_vec16(const Context&, const TensorView& loss, const TensorView& input, const TensorView& target,
                    const TensorView& labels, double beta, int64_t ignore_index);
const char* jsd_cuda_applicable(const TensorView& loss, const TensorView& input, const TensorView& target,
                                const TensorView& labels, double beta, int64_t ignore_index);
const char* jsd_cuda_vec16_applicable(const TensorView& loss, const TensorView& input, const TensorView& target,
                                      const TensorView& labels, double beta, int64_t ignore_index);

// cuda_vec16_fast (cuda_divergence.cu, Note [unrolled pair rows]): reduced forward only.
void kl_div_cuda_vec16_fast(const Context&, const TensorView& loss, const TensorView& y_pred,
                            const TensorView& y_true, bool log_target, std::string_view reduction, double eps);
const char* kl_div_cuda_vec16_fast_applicable(const TensorView& loss, const TensorView& y_pred,
                                              const TensorView& y_true, bool log_target,
                                              std::string_view reduction, double eps);
void jsd_cuda_vec16_fast(const Context&, const TensorView& loss, const TensorView& input,
                         const TensorView& target, const TensorView& labels, double beta, int64_t ignore_index);
const char* jsd_cuda_vec16_fast_applicable(const TensorView& loss, const TensorView& input,
                                           const TensorView& target, const TensorView& labels, double beta,
                                           int64_t ignore_index);
void jsd_backward_cuda(const Context&, const TensorView& dinput, const TensorView& dloss, const TensorView& input,
                       const TensorView& target, const TensorView& labels, double beta, int64_t ignore_index);
void jsd_backward_cuda_vec16(const Context&, const TensorView& dinput, const TensorView& dloss,
                             const TensorView& input, const TensorView& target, const TensorView& labels,
                             double beta, int64_t ignore_index);
const char* jsd_backward_cuda_applicable(const TensorView& dinput, const TensorView& dloss, const TensorView& input,
                                         const TensorView& target, const TensorView& labels, double beta,
                                         int64_t ignore_index);
const char* jsd_backward_cuda_vec16_applicable(const TensorView& dinput, const TensorView& dloss,
                                               const TensorView& input, const TensorView& target,
                                               const TensorView& labels, double beta, int64_t ignore_index);

void tvd_cuda(const Context&, const TensorView& loss, const TensorView& p, const TensorView& q,
              const TensorView& labels, std::string_view reduction, int64_t ignore_index);
void tvd_cuda_vec16(const Context&, const TensorView& loss, const TensorView& p, const TensorView& q,
                    const TensorView& labels, std::string_view reduction, int64_t ignore_index);
const char* tvd_cuda_applicable(const TensorView& loss, const TensorView& p, const TensorView& q,
                                const TensorView& labels, std::string_view reduction, int64_t ignore_index);
const char* tvd_cuda_vec16_applicable(const TensorView& loss, const TensorView& p, const TensorView& q,
                                      const TensorView& labels, std::string_view reduction, int64_t ignore_index);

void tvd_backward_cuda(const Context&, const TensorView& dp, const TensorView& dloss, const TensorView& p,
                       const TensorView& q, const TensorView& labels, std::string_view reduction,
                       int64_t ignore_index);
void tvd_backward_cuda_vec16(const Context&, const TensorView& dp, const TensorView& dloss, const TensorView& p,
                             const TensorView& q, const TensorView& labels, std::string_view reduction,
                             int64_t ignore_index);
const char* tvd_backward_cuda_applicable(const TensorView& dp, const TensorView& dloss, const TensorView& p,
                                         const TensorView& q, const TensorView& labels, std::string_view reduction,
                                         int64_t ignore_index);
const char* tvd_backward_cuda_vec16_applicable(const TensorView& dp, const TensorView& dloss, const TensorView& p,
                                               const TensorView& q, const TensorView& labels,
                                               std::string_view reduction, int64_t ignore_index);

// Registers the kernels above (called from src/registry/register_all.cpp in CUDA builds);
// register_loss_cuda calls register_divergence_cuda (ops/loss/cuda_divergence.cu) and
// register_ce_with_grad_cuda (ops/loss/cuda_fused.cu).
void register_loss_cuda(Registry& reg);
void register_divergence_cuda(Registry& reg);
void register_ce_with_grad_cuda(Registry& reg);

}  // namespace opforge
