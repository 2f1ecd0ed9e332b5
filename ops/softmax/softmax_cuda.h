// CUDA kernels of the softmax family (ops/softmax/cuda.cu), declared for registration and for
// tests that call them directly. Two kernels per op, as in ops/activation/activation_cuda.h:
//   <op>_cuda        any layout the op's check accepts (scalar loads); predicate: dtype only
//   <op>_cuda_vec16  16-byte packs; predicate: alignment, row length and row strides
#pragma once

#include "ops/softmax/softmax.h"

namespace opforge {

#define OPFORGE_DECLARE_SOFTMAX_FORWARD_CUDA(op)                                                  \
  void op##_cuda(const Context&, const TensorView& y, const TensorView& x);                     \
  void op##_cuda_vec16(const Context&, const TensorView& y, const TensorView& x);               \
  const char* op##_cuda_applicable(const TensorView& y, const TensorView& x);                   \
  const char* op##_cuda_vec16_applicable(const TensorView& y, const TensorView& x);
#define OPFORGE_DECLARE_SOFTMAX_BACKWARD_CUDA(op)                                                 \
  void op##_cuda(const Context&, const TensorView& dx, const TensorView& dy, const TensorView& y); \
  void op##_cuda_vec16(const Context&, const TensorView& dx, const TensorView& dy,              \
                       const TensorView& y);                                                    \
  const char* op##_cuda_applicable(const TensorView& dx, const TensorView& dy, const TensorView& y); \
  const char* op##_cuda_vec16_applicable(const TensorView& dx, const TensorView& dy,            \
                                         const TensorView& y);

OPFORGE_DECLARE_SOFTMAX_FORWARD_CUDA(softmax)
OPFORGE_DECLARE_SOFTMAX_FORWARD_CUDA(log_softmax)
OPFORGE_DECLARE_SOFTMAX_BACKWARD_CUDA(softmax_backward)
OPFORGE_DECLARE_SOFTMAX_BACKWARD_CUDA(log_softmax_backward)
#undef OPFORGE_DECLARE_SOFTMAX_FORWARD_CUDA
#undef OPFORGE_DECLARE_SOFTMAX_BACKWARD_CUDA

// Registers the kernels above (called from src/registry/register_all.cpp in CUDA builds).
void register_softmax_cuda(Registry& reg);

}  // namespace opforge
