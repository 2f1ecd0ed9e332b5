// CUDA kernels of the routing family (ops/routing/cuda.cu), declared for registration and for
// tests that call them directly:
//   topk_softmax_cuda_vec  one vector load of a lane's experts; predicate: E = 32, 64, 128 or 256,
//                          alignment and row stride
//   topk_softmax_cuda      any layout, E <= 256 (scalar loads, padded lanes)
//   grouped_topk_cuda      any layout, E <= 256, up to 32 groups, bias f32 or of the logits' dtype
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

void register_routing_cuda(Registry& reg);

}  // namespace opforge
