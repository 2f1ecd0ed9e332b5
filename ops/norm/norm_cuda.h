// CUDA kernels of the norm family (ops/norm/cuda.cu, ops/norm/cuda_backward.cu), declared for
// registration and for tests that call them directly. Two kernels per op:
//   <op>_cuda        any layout the op's check accepts (scalar loads); predicate: dtype only
//   <op>_cuda_vec16  16-byte packs with the row held in registers; predicate: alignment and sizes
// A predicate returns nullptr when its kernel accepts the arguments, else a static reason.
#pragma once

#include "ops/norm/norm.h"

namespace opforge {

// ---- rms_norm ----
void rms_norm_cuda(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                   double eps, double offset);
const char* rms_norm_cuda_applicable(const TensorView& y, const TensorView& x, const TensorView& w,
                                     double eps, double offset);
void rms_norm_cuda_vec16(const Context&, const TensorView& y, const TensorView& x,
                         const TensorView& w, double eps, double offset);
const char* rms_norm_cuda_vec16_applicable(const TensorView& y, const TensorView& x,
                                           const TensorView& w, double eps, double offset);

// ---- fused_add_rms_norm ----
void fused_add_rms_norm_cuda(const Context&, const TensorView& y, const TensorView& s,
                             const TensorView& x, const TensorView& residual, const TensorView& w,
                             double eps, double offset);
const char* fused_add_rms_norm_cuda_applicable(const TensorView& y, const TensorView& s,
                                               const TensorView& x, const TensorView& residual,
                                               const TensorView& w, double eps, double offset);
void fused_add_rms_norm_cuda_vec16(const Context&, const TensorView& y, const TensorView& s,
                                   const TensorView& x, const TensorView& residual,
                                   const TensorView& w, double eps, double offset);
const char* fused_add_rms_norm_cuda_vec16_applicable(const TensorView& y, const TensorView& s,
                                                     const TensorView& x,
                                                     const TensorView& residual,
                                                     const TensorView& w, double eps,
                                                     double offset);

// ---- rms_norm_backward ----
void rms_norm_backward_cuda(const Context&, const TensorView& dx, const TensorView& dw,
                            const TensorView& dy, const TensorView& x, const TensorView& w,
                            double eps, double offset);
const char* rms_norm_backward_cuda_applicable(const TensorView& dx, const TensorView& dw,
                                              const TensorView& dy, const TensorView& x,
                                              const TensorView& w, double eps, double offset);
void rms_norm_backward_cuda_vec16(const Context&, const TensorView& dx, const TensorView& dw,
                                  const TensorView& dy, const TensorView& x, const TensorView& w,
                                  double eps, double offset);
const char* rms_norm_backward_cuda_vec16_applicable(const TensorView& dx, const TensorView& dw,
                                                    const TensorView& dy, const TensorView& x,
                                                    const TensorView& w, double eps,
                                                    double offset);

// ---- fused_add_rms_norm_backward ----
void fused_add_rms_norm_backward_cuda(const Context&, const TensorView& dx,
                                      const TensorView& dresidual, const TensorView& dw,
                                      const TensorView& dy, const TensorView& ds,
                                      const TensorView& x, const TensorView& residual,
                                      const TensorView& w, double eps, double offset);
const char* fused_add_rms_norm_backward_cuda_applicable(
    const TensorView& dx, const TensorView& dresidual, const TensorView& dw, const TensorView& dy,
    const TensorView& ds, const TensorView& x, const TensorView& residual, const TensorView& w,
    double eps, double offset);
void fused_add_rms_norm_backward_cuda_vec16(const Context&, const TensorView& dx,
                                            const TensorView& dresidual, const TensorView& dw,
                                            const TensorView& dy, const TensorView& ds,
                                            const TensorView& x, const TensorView& residual,
                                            const TensorView& w, double eps, double offset);
const char* fused_add_rms_norm_backward_cuda_vec16_applicable(
    const TensorView& dx, const TensorView& dresidual, const TensorView& dw, const TensorView& dy,
    const TensorView& ds, const TensorView& x, const TensorView& residual, const TensorView& w,
    double eps, double offset);

// ---- Gemma's RMSNorm ops (cuda_gemma.cu): the kernels above with offset = 1 ----
void register_gemma_norm_cuda(Registry& reg);

}  // namespace opforge
