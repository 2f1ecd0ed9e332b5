// CUDA kernels of the layernorm family (ops/layernorm/cuda.cu), declared for registration and for
// tests that call them directly. Two kernels per op, as in ops/norm/norm_cuda.h:
//   <op>_cuda        any layout the op's check accepts (scalar loads); predicate: dtype only
//   <op>_cuda_vec16  16-byte packs with the row held in registers; predicate: alignment and sizes
// A predicate returns nullptr when its kernel accepts the arguments, else a static reason.
#pragma once

#include "ops/layernorm/layernorm.h"

namespace opforge {

void layer_norm_cuda(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                     const TensorView& b, double eps);
const char* layer_norm_cuda_applicable(const TensorView& y, const TensorView& x,
                                       const TensorView& w, const TensorView& b, double eps);
void layer_norm_cuda_vec16(const Context&, const TensorView& y, const TensorView& x,
                           const TensorView& w, const TensorView& b, double eps);
const char* layer_norm_cuda_vec16_applicable(const TensorView& y, const TensorView& x,
                                             const TensorView& w, const TensorView& b, double eps);

void layer_norm_backward_cuda(const Context&, const TensorView& dx, const TensorView& dw,
                              const TensorView& db, const TensorView& dy, const TensorView& x,
                              const TensorView& w, double eps);
const char* layer_norm_backward_cuda_applicable(const TensorView& dx, const TensorView& dw,
                                                const TensorView& db, const TensorView& dy,
                                                const TensorView& x, const TensorView& w,
                                                double eps);
void layer_norm_backward_cuda_vec16(const Context&, const TensorView& dx, const TensorView& dw,
                                    const TensorView& db, const TensorView& dy,
                                    const TensorView& x, const TensorView& w, double eps);
const char* layer_norm_backward_cuda_vec16_applicable(const TensorView& dx, const TensorView& dw,
                                                      const TensorView& db, const TensorView& dy,
                                                      const TensorView& x, const TensorView& w,
                                                      double eps);

// Bandwidth-first kernels (ops/layernorm/cuda_fast.cu), registered above the cuda_vec16 ones:
//   layer_norm_cuda_vec16_rowblock            one small block per row, 8 packs a thread
//   layer_norm_backward_cuda_vec16_async      cp.async row pipeline, one cooperative launch
void layer_norm_cuda_vec16_rowblock(const Context&, const TensorView& y, const TensorView& x,
                                    const TensorView& w, const TensorView& b, double eps);
const char* layer_norm_cuda_vec16_rowblock_applicable(const TensorView& y, const TensorView& x,
                                                      const TensorView& w, const TensorView& b,
                                                      double eps);
void layer_norm_backward_cuda_vec16_async(const Context&, const TensorView& dx,
                                          const TensorView& dw, const TensorView& db,
                                          const TensorView& dy, const TensorView& x,
                                          const TensorView& w, double eps);
const char* layer_norm_backward_cuda_vec16_async_applicable(const TensorView& dx,
                                                            const TensorView& dw,
                                                            const TensorView& db,
                                                            const TensorView& dy,
                                                            const TensorView& x,
                                                            const TensorView& w, double eps);
void register_layernorm_cuda_fast(Registry& reg);

void register_layernorm_cuda(Registry& reg);  // cuda.cu: every kernel of both files

}  // namespace opforge
