// Routing family (MoE gating): topk_softmax and grouped_topk.
//
// Greppable chain: op `topk_softmax` -> topk_softmax_reference (reference.cpp), topk_softmax_cpu
// (cpu.cpp). Cases in cases.cpp, checks / shapes / costs in routing.cpp.
//
// Note [routing ties]: experts are ranked by a key, highest first; equal keys rank the lower
// expert id first (groups likewise by group id), so every kernel picks the same ids. Without a
// correction bias the key is the logit itself: softmax and sigmoid are increasing, so ranking
// logits ranks scores, exactly and in any precision. With e_score_correction_bias the key is
// score + bias, computed in f32 by the cpu kernel and in f64 by the reference; the two could pick
// differently only where two keys lie within f32 rounding of each other.
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

struct TopkSoftmax {
  static constexpr const char* name = "topk_softmax";
  using Signature = void(const TensorView& topk_weights, const TensorView& topk_ids,
                         const TensorView& gating_output, int64_t topk, bool renormalize);
  static constexpr ArgSpec args[] = {{"topk_weights", ArgRole::out},
                                     {"topk_ids", ArgRole::out},
                                     {"gating_output", ArgRole::in},
                                     {"topk", ArgRole::scalar, "8"},
                                     {"renormalize", ArgRole::scalar, "false"}};
  static constexpr const char* doc =
      "vLLM's topk_softmax (MoE routing). gating_output: [T, E] floating (rows may be padded); "
      "p = softmax over the E experts of each token; topk_ids: i32 [T, topk], the topk experts of "
      "highest p in descending order (Note [routing ties]: equal logits pick the lower id first); "
      "topk_weights: f32 [T, topk], p of those experts, divided by their sum when renormalize. "
      "1 <= topk <= E. Softmax in f32 on the cpu kernel, f64 in the reference. Differs from "
      "vLLM: no token_expert_indices output.";
  static void check(const TensorView& topk_weights, const TensorView& topk_ids,
                    const TensorView& gating_output, int64_t topk, bool renormalize);
};

struct GroupedTopk {
  static constexpr const char* name = "grouped_topk";
  using Signature = void(const TensorView& topk_weights, const TensorView& topk_ids,
                         const TensorView& gating_output, const TensorView& e_score_correction_bias,
                         int64_t topk, bool renormalize, int64_t num_expert_group,
                         int64_t topk_group, std::string_view scoring_func,
                         double routed_scaling_factor);
  static constexpr ArgSpec args[] = {{"topk_weights", ArgRole::out},
                                     {"topk_ids", ArgRole::out},
                                     {"gating_output", ArgRole::in},
                                     {"e_score_correction_bias", ArgRole::opt_in},
                                     {"topk", ArgRole::scalar, "8"},
                                     {"renormalize", ArgRole::scalar, "true"},
                                     {"num_expert_group", ArgRole::scalar, "8"},
                                     {"topk_group", ArgRole::scalar, "4"},
                                     {"scoring_func", ArgRole::scalar, "softmax"},
                                     {"routed_scaling_factor", ArgRole::scalar, "1"}};
  static constexpr const char* doc =
      "vLLM's grouped_topk (DeepSeek-V2/V3 routing). gating_output: [T, E]; s = softmax(logits) "
      "or sigmoid(logits) per scoring_func. The E experts form num_expert_group groups of "
      "E / num_expert_group. Without e_score_correction_bias ([E], floating) a group's score is "
      "its max s; with it, k = s + bias and a group's score is the sum of its two largest k. The "
      "topk_group best groups are kept; topk_ids (i32 [T, topk]) are the topk experts of highest "
      "s (or k) among them, descending (Note [routing ties]); topk_weights (f32 [T, topk]) are "
      "their s (never the biased k), divided by their sum when renormalize, then multiplied by "
      "routed_scaling_factor. Errors: E not divisible by num_expert_group, topk_group out of "
      "[1, num_expert_group], topk above the experts of topk_group groups, a bias with groups "
      "of one expert.";
  static void check(const TensorView& topk_weights, const TensorView& topk_ids,
                    const TensorView& gating_output, const TensorView& e_score_correction_bias,
                    int64_t topk, bool renormalize, int64_t num_expert_group, int64_t topk_group,
                    std::string_view scoring_func, double routed_scaling_factor);
};

void register_routing(Registry& reg);  // routing.cpp: ops, reference + cpu kernels, cases

}  // namespace opforge
