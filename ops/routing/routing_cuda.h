// CUDA kernels of the routing family (ops/routing/cuda.cu), declared for registration and for
// tests that call them directly:
//   topk_softmax_cuda_vec  one vector load of a lane's experts; predicate: E = 32, 64, 128 or 256,
//                          alignment and row stride
//   topk_softmax_cuda      any layout, E <= 256 (scalar loads, padded lanes)
//   grouped_topk_cuda      any layout, E <= 256, up to 32 groups, bias f32 or of the logits' dtype
// and of moe_permute / moe_unpermute (ops/routing/cuda_moe.cu):
//   moe_permute_cuda_vec16    16-byte row copies; predicate: E <= 4095, x and permuted rows as
//                             16-byte packs (aligned bases, hidden and row strides multiples)
//   moe_permute_cuda          element row copies, any row layout, E <= 4095
//   moe_unpermute_cuda_vec16  16-byte loads; predicate: expert_out and y rows as 16-byte packs
//   moe_unpermute_cuda        element loads, any row layout
// A predicate returns nullptr when its kernel accepts the arguments, else a static reason.
#pragma once

#include "ops/routing/routing.h"

namespace opforge {

void topk_softmax_cuda(const Context&, const TensorView& topk_weights, const TensorView& topk_ids,
                       const TensorView& gating_output, int64_t topk, bool renormalize);
const char* topk_softmax_cuda_applicable(const TensorView& topk_weights,
                                         const TensorView& topk_ids,
                                         const TensorView& gating_output, int64_t topk,
                                         bool renormalize);
void topk_softmax_cuda_vec(const Context&, const TensorView& topk_weights,
                           const TensorView& topk_ids, const TensorView& gating_output,
                           int64_t topk, bool renormalize);
const char* topk_softmax_cuda_vec_applicable(const TensorView& topk_weights,
                                             const TensorView& topk_ids,
                                             const TensorView& gating_output, int64_t topk,
                                             bool renormalize);

void grouped_topk_cuda(const Context&, const TensorView& topk_weights, const TensorView& topk_ids,
                       const TensorView& gating_output, const TensorView& e_score_correction_bias,
                       int64_t topk, bool renormalize, int64_t num_expert_group,
                       int64_t topk_group, std::string_view scoring_func,
                       double routed_scaling_factor);
const char* grouped_topk_cuda_applicable(const TensorView& topk_weights,
                                         const TensorView& topk_ids,
                                         const TensorView& gating_output,
                                         const TensorView& e_score_correction_bias, int64_t topk,
                                         bool renormalize, int64_t num_expert_group,
                                         int64_t topk_group, std::string_view scoring_func,
                                         double routed_scaling_factor);

void moe_permute_cuda(const Context&, const TensorView& permuted, const TensorView& expert_offsets,
                      const TensorView& inv_perm, const TensorView& x, const TensorView& topk_ids,
                      int64_t num_experts);
const char* moe_permute_cuda_applicable(const TensorView& permuted, const TensorView& expert_offsets,
                                        const TensorView& inv_perm, const TensorView& x,
                                        const TensorView& topk_ids, int64_t num_experts);
void moe_permute_cuda_vec16(const Context&, const TensorView& permuted, const TensorView& expert_offsets,
                            const TensorView& inv_perm, const TensorView& x, const TensorView& topk_ids,
                            int64_t num_experts);
const char* moe_permute_cuda_vec16_applicable(const TensorView& permuted, const TensorView& expert_offsets,
                                              const TensorView& inv_perm, const TensorView& x,
                                              const TensorView& topk_ids, int64_t num_experts);
void moe_unpermute_cuda(const Context&, const TensorView& y, const TensorView& expert_out,
                        const TensorView& inv_perm, const TensorView& topk_weights);
const char* moe_unpermute_cuda_applicable(const TensorView& y, const TensorView& expert_out,
                                          const TensorView& inv_perm, const TensorView& topk_weights);
void moe_unpermute_cuda_vec16(const Context&, const TensorView& y, const TensorView& expert_out,
                              const TensorView& inv_perm, const TensorView& topk_weights);
const char* moe_unpermute_cuda_vec16_applicable(const TensorView& y, const TensorView& expert_out,
                                                const TensorView& inv_perm, const TensorView& topk_weights);
void register_moe_cuda(Registry& reg);  // cuda_moe.cu

void register_routing_cuda(Registry& reg);

}  // namespace opforge
