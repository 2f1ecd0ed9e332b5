// CUDA kernels of the pointwise activations (gelu_new, gelu_fast, quick_gelu, relu2, xielu) and of
// swigluoai_and_mul, forward and backward (ops/activation/cuda_pointwise.cu). Two kernels per op,
// as in activation_cuda.h:
//   cuda        any layout the op's check accepts (scalar loads); predicate: dtype only
//   cuda_vec16  16-byte packs; predicate: alignment, row length and row strides multiples of the
//               pack (swigluoai_and_mul: d a multiple of the pack)
// The kernels are registered by register_activation_pointwise_cuda (called by register_all).
#pragma once

#include "ops/activation/activation.h"

namespace opforge {

void register_activation_pointwise_cuda(Registry& reg);

}  // namespace opforge
