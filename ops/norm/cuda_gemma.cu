// CUDA kernels of Gemma's RMSNorm ops (gemma_rms_norm, gemma_fused_add_rms_norm and their backward
// ops): the rms_norm kernels of cuda.cu / cuda_backward.cu with offset = 1, so the gain is
// (1 + w) computed in f32 and x * rstd * (1 + w) is rounded once (Gemma's order: the product is
// formed in f32 and only the result is cast, GemmaRmsNorm's doc string).
//
// Technique: that of the rms_norm kernels (header of cuda.cu and cuda_backward.cu): cuda_vec16 holds
// the row in registers as 16-byte packs (LDG.128 / STG.128) with an alignment / size predicate that
// sends odd layouts to the scalar `cuda` kernel; f32 accumulation; warp then block reductions in a
// fixed order; launch shape from the SM count; int64 row offsets; dw of the backward ops reduced
// deterministically (per-block f32 partials summed in fixed order). One launch per call on the
// Context's stream (two for the scalar backward), no host synchronization, no allocation after the
// first call of a shape.
#include "backends/cuda/cuda_backend.h"
#include "ops/norm/internal.h"
#include "ops/norm/norm_cuda.h"

namespace opforge {
namespace {

// ---- gemma_rms_norm --------------------------------------------------------------------------------
void gemma_rms_norm_cuda(const Context& ctx, const TensorView& y, const TensorView& x,
                         const TensorView& w, double eps) {
  rms_norm_cuda(ctx, y, x, w, eps, 1.0);
}
const char* gemma_rms_norm_cuda_applicable(const TensorView& y, const TensorView& x,
                                           const TensorView& w, double eps) {
  return rms_norm_cuda_applicable(y, x, w, eps, 1.0);
}
void gemma_rms_norm_cuda_vec16(const Context& ctx, const TensorView& y, const TensorView& x,
                               const TensorView& w, double eps) {
  rms_norm_cuda_vec16(ctx, y, x, w, eps, 1.0);
}
const char* gemma_rms_norm_cuda_vec16_applicable(const TensorView& y, const TensorView& x,
                                                 const TensorView& w, double eps) {
  return rms_norm_cuda_vec16_applicable(y, x, w, eps, 1.0);
}

// ---- gemma_fused_add_rms_norm ------------------------------------------------------------------------
void gemma_fused_add_rms_norm_cuda(const Context& ctx, const TensorView& y, const TensorView& s,
                                   const TensorView& x, const TensorView& residual,
                                   const TensorView& w, double eps) {
  fused_add_rms_norm_cuda(ctx, y, s, x, residual, w, eps, 1.0);
}
const char* gemma_fused_add_rms_norm_cuda_applicable(const TensorView& y, const TensorView& s,
                                                     const TensorView& x,
                                                     const TensorView& residual,
                                                     const TensorView& w, double eps) {
  return fused_add_rms_norm_cuda_applicable(y, s, x, residual, w, eps, 1.0);
}
void gemma_fused_add_rms_norm_cuda_vec16(const Context& ctx, const TensorView& y,
                                         const TensorView& s, const TensorView& x,
                                         const TensorView& residual, const TensorView& w,
                                         double eps) {
  fused_add_rms_norm_cuda_vec16(ctx, y, s, x, residual, w, eps, 1.0);
}
const char* gemma_fused_add_rms_norm_cuda_vec16_applicable(const TensorView& y,
                                                           const TensorView& s,
                                                           const TensorView& x,
                                                           const TensorView& residual,
                                                           const TensorView& w, double eps) {
  return fused_add_rms_norm_cuda_vec16_applicable(y, s, x, residual, w, eps, 1.0);
}

// ---- gemma_rms_norm_backward -------------------------------------------------------------------------
void gemma_rms_norm_backward_cuda(const Context& ctx, const TensorView& dx, const TensorView& dw,
                                  const TensorView& dy, const TensorView& x, const TensorView& w,
                                  double eps) {
  rms_norm_backward_cuda(ctx, dx, dw, dy, x, w, eps, 1.0);
}
const char* gemma_rms_norm_backward_cuda_applicable(const TensorView& dx, const TensorView& dw,
                                                    const TensorView& dy, const TensorView& x,
                                                    const TensorView& w, double eps) {
  return rms_norm_backward_cuda_applicable(dx, dw, dy, x, w, eps, 1.0);
}
void gemma_rms_norm_backward_cuda_vec16(const Context& ctx, const TensorView& dx,
                                        const TensorView& dw, const TensorView& dy,
                                        const TensorView& x, const TensorView& w, double eps) {
  rms_norm_backward_cuda_vec16(ctx, dx, dw, dy, x, w, eps, 1.0);
}
const char* gemma_rms_norm_backward_cuda_vec16_applicable(const TensorView& dx,
                                                          const TensorView& dw,
                                                          const TensorView& dy,
                                                          const TensorView& x,
                                                          const TensorView& w, double eps) {
  return rms_norm_backward_cuda_vec16_applicable(dx, dw, dy, x, w, eps, 1.0);
}

// ---- gemma_fused_add_rms_norm_backward ---------------------------------------------------------------
void gemma_fused_add_rms_norm_backward_cuda(const Context& ctx, const TensorView& dx,
                                            const TensorView& dresidual, const TensorView& dw,
                                            const TensorView& dy, const TensorView& ds,
                                            const TensorView& x, const TensorView& residual,
                                            const TensorView& w, double eps) {
  fused_add_rms_norm_backward_cuda(ctx, dx, dresidual, dw, dy, ds, x, residual, w, eps, 1.0);
}
const char* gemma_fused_add_rms_norm_backward_cuda_applicable(
    const TensorView& dx, const TensorView& dresidual, const TensorView& dw, const TensorView& dy,
    const TensorView& ds, const TensorView& x, const TensorView& residual, const TensorView& w,
    double eps) {
  return fused_add_rms_norm_backward_cuda_applicable(dx, dresidual, dw, dy, ds, x, residual, w,
                                                     eps, 1.0);
}
void gemma_fused_add_rms_norm_backward_cuda_vec16(const Context& ctx, const TensorView& dx,
                                                  const TensorView& dresidual,
                                                  const TensorView& dw, const TensorView& dy,
                                                  const TensorView& ds, const TensorView& x,
                                                  const TensorView& residual, const TensorView& w,
                                                  double eps) {
  fused_add_rms_norm_backward_cuda_vec16(ctx, dx, dresidual, dw, dy, ds, x, residual, w, eps, 1.0);
}
const char* gemma_fused_add_rms_norm_backward_cuda_vec16_applicable(
    const TensorView& dx, const TensorView& dresidual, const TensorView& dw, const TensorView& dy,
    const TensorView& ds, const TensorView& x, const TensorView& residual, const TensorView& w,
    double eps) {
  return fused_add_rms_norm_backward_cuda_vec16_applicable(dx, dresidual, dw, dy, ds, x, residual,
                                                           w, eps, 1.0);
}

}  // namespace

void register_gemma_norm_cuda(Registry& reg) {
  const char* vec = "rms_norm's cuda_vec16 kernel with offset 1: row in registers, 16-byte packs";
  const char* scalar = "rms_norm's cuda kernel with offset 1: any layout, scalar loads";
  reg.add_kernel<GemmaRmsNorm>(cuda_kernel_desc("cuda_vec16", 200, vec, true),
                               &gemma_rms_norm_cuda_vec16, &gemma_rms_norm_cuda_vec16_applicable);
  reg.add_kernel<GemmaRmsNorm>(cuda_kernel_desc("cuda", 100, scalar, true), &gemma_rms_norm_cuda,
                               &gemma_rms_norm_cuda_applicable);
  reg.add_kernel<GemmaFusedAddRmsNorm>(cuda_kernel_desc("cuda_vec16", 200, vec, true),
                                       &gemma_fused_add_rms_norm_cuda_vec16,
                                       &gemma_fused_add_rms_norm_cuda_vec16_applicable);
  reg.add_kernel<GemmaFusedAddRmsNorm>(cuda_kernel_desc("cuda", 100, scalar, true),
                                       &gemma_fused_add_rms_norm_cuda,
                                       &gemma_fused_add_rms_norm_cuda_applicable);

  // Note [f32 dw tolerance] (cuda.cu): the f32 dw sum over many rows allows 1e-4.
  auto bwd_desc = [](const char* impl, int priority, const char* summary) {
    return with_f32_dw_tolerance(cuda_kernel_desc(impl, priority, summary, false));
  };
  const char* bwd_vec = "rms_norm_backward's cuda_vec16 kernel with offset 1";
  const char* bwd_scalar = "rms_norm_backward's cuda kernel with offset 1";
  reg.add_kernel<GemmaRmsNormBackward>(bwd_desc("cuda_vec16", 200, bwd_vec),
                                       &gemma_rms_norm_backward_cuda_vec16,
                                       &gemma_rms_norm_backward_cuda_vec16_applicable);
  reg.add_kernel<GemmaRmsNormBackward>(bwd_desc("cuda", 100, bwd_scalar),
                                       &gemma_rms_norm_backward_cuda,
                                       &gemma_rms_norm_backward_cuda_applicable);
  reg.add_kernel<GemmaFusedAddRmsNormBackward>(
      bwd_desc("cuda_vec16", 200, "fused_add_rms_norm_backward's cuda_vec16 kernel with offset 1"),
      &gemma_fused_add_rms_norm_backward_cuda_vec16,
      &gemma_fused_add_rms_norm_backward_cuda_vec16_applicable);
  reg.add_kernel<GemmaFusedAddRmsNormBackward>(
      bwd_desc("cuda", 100, "fused_add_rms_norm_backward's cuda kernel with offset 1"),
      &gemma_fused_add_rms_norm_backward_cuda, &gemma_fused_add_rms_norm_backward_cuda_applicable);
}

}  // namespace opforge
