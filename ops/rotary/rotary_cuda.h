// CUDA kernels of the rotary family (ops/rotary/cuda.cu), declared for registration and for tests
// that call them directly. Two kernels per op:
//   <op>_cuda        any layout the op's check accepts (one pair per thread-step); predicate: dtype
//   <op>_cuda_vec16  16-byte packs of a head row; predicate: alignment, sizes and strides
// A predicate returns nullptr when its kernel accepts the arguments, else a static reason.
#pragma once

#include "ops/rotary/rotary.h"

namespace opforge {

void rotary_embedding_cuda(const Context&, const TensorView& positions, const TensorView& query,
                           const TensorView& key, const TensorView& cos_sin_cache,
                           int64_t head_size, bool is_neox);
void rotary_embedding_cuda_vec16(const Context&, const TensorView& positions,
                                 const TensorView& query, const TensorView& key,
                                 const TensorView& cos_sin_cache, int64_t head_size, bool is_neox);
void rotary_embedding_backward_cuda(const Context&, const TensorView& positions,
                                    const TensorView& dquery, const TensorView& dkey,
                                    const TensorView& cos_sin_cache, int64_t head_size,
                                    bool is_neox);
void rotary_embedding_backward_cuda_vec16(const Context&, const TensorView& positions,
                                          const TensorView& dquery, const TensorView& dkey,
                                          const TensorView& cos_sin_cache, int64_t head_size,
                                          bool is_neox);
// Shared by the forward and backward ops (same arguments).
const char* rotary_embedding_cuda_applicable(const TensorView& positions, const TensorView& query,
                                             const TensorView& key,
                                             const TensorView& cos_sin_cache, int64_t head_size,
                                             bool is_neox);
const char* rotary_embedding_cuda_vec16_applicable(const TensorView& positions,
                                                   const TensorView& query, const TensorView& key,
                                                   const TensorView& cos_sin_cache,
                                                   int64_t head_size, bool is_neox);

void register_rotary_cuda(Registry& reg);

}  // namespace opforge
