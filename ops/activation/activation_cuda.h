// CUDA kernels of the activation family (ops/activation/cuda.cu), declared for registration and for
// tests that call them directly. Two kernels per op, as in ops/norm/norm_cuda.h:
//   <op>_cuda        any layout the op's check accepts (scalar loads); predicate: dtype only
//   <op>_cuda_vec16  16-byte packs; predicate: alignment, d % (16 / itemsize), row strides
#pragma once

#include "ops/activation/activation.h"

namespace opforge {

void silu_and_mul_cuda(const Context&, const TensorView& y, const TensorView& x);
const char* silu_and_mul_cuda_applicable(const TensorView& y, const TensorView& x);
void silu_and_mul_cuda_vec16(const Context&, const TensorView& y, const TensorView& x);
const char* silu_and_mul_cuda_vec16_applicable(const TensorView& y, const TensorView& x);

void silu_and_mul_backward_cuda(const Context&, const TensorView& dx, const TensorView& dy,
                                const TensorView& x);
const char* silu_and_mul_backward_cuda_applicable(const TensorView& dx, const TensorView& dy,
                                                  const TensorView& x);
void silu_and_mul_backward_cuda_vec16(const Context&, const TensorView& dx, const TensorView& dy,
                                      const TensorView& x);
const char* silu_and_mul_backward_cuda_vec16_applicable(const TensorView& dx,
                                                        const TensorView& dy,
                                                        const TensorView& x);

// gelu_and_mul, mul_and_silu, fatrelu_and_mul and their backward ops (cuda_gated.cu); called by
// register_activation_cuda.
void register_gated_activation_cuda(Registry& reg);

}  // namespace opforge
