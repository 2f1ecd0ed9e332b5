// CUDA kernel of the attention family (ops/attention/cuda.cu), declared for registration and for
// tests that call it directly.
//   attention_decode_cuda  split-K decoding with GQA sharing; predicate: dtype, head_dim <= 256,
//                          at most 8 query heads per kv head
#pragma once

#include "ops/attention/attention.h"

namespace opforge {

void attention_decode_cuda(const Context&, const TensorView& out, const TensorView& q,
                           const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView& seq_lens, double softmax_scale);
const char* attention_decode_cuda_applicable(const TensorView& out, const TensorView& q,
                                             const TensorView& k_cache, const TensorView& v_cache,
                                             const TensorView& seq_lens, double softmax_scale);

void register_attention_cuda(Registry& reg);

}  // namespace opforge
