// CUDA kernels of the embedding family (ops/embedding/cuda.cu), declared for registration and for
// tests that call them directly. Two kernels per op:
//   <op>_cuda        any layout the op's check accepts (one element per step); predicate: dtype
//   <op>_cuda_vec16  16-byte packs of each row; predicate: alignment, dim and row strides
#pragma once

#include "ops/embedding/embedding.h"

namespace opforge {

void embedding_cuda(const Context&, const TensorView& y, const TensorView& ids, const TensorView& w,
                    int64_t padding_idx);
const char* embedding_cuda_applicable(const TensorView& y, const TensorView& ids,
                                      const TensorView& w, int64_t padding_idx);
void embedding_cuda_vec16(const Context&, const TensorView& y, const TensorView& ids,
                          const TensorView& w, int64_t padding_idx);
const char* embedding_cuda_vec16_applicable(const TensorView& y, const TensorView& ids,
                                            const TensorView& w, int64_t padding_idx);

void embedding_backward_cuda(const Context&, const TensorView& dw, const TensorView& dy,
                             const TensorView& ids, const TensorView& w, int64_t padding_idx);
const char* embedding_backward_cuda_applicable(const TensorView& dw, const TensorView& dy,
                                               const TensorView& ids, const TensorView& w,
                                               int64_t padding_idx);
void embedding_backward_cuda_vec16(const Context&, const TensorView& dw, const TensorView& dy,
                                   const TensorView& ids, const TensorView& w, int64_t padding_idx);
const char* embedding_backward_cuda_vec16_applicable(const TensorView& dw, const TensorView& dy,
                                                     const TensorView& ids, const TensorView& w,
                                                     int64_t padding_idx);

void register_embedding_cuda(Registry& reg);

}  // namespace opforge
