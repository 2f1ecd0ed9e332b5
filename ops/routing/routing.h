// Routing family (MoE gating): topk_softmax and grouped_topk; MoE data movement: moe_permute and
// moe_unpermute (moe.cpp: checks, kernels, cases).
//
// Greppable chain: op `topk_softmax` -> topk_softmax_reference (reference.cpp), topk_softmax_cpu
// (cpu.cpp). Cases in cases.cpp, checks / shapes / costs in routing.cpp. moe_permute /
// moe_unpermute: moe.cpp (checks, reference, cpu permute, cases), cpu_moe.cpp (cpu unpermute),
// cuda_moe.cu.
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

// Note [moe permutation]: moe_permute sorts the T * k (token, slot) pairs p = t * k + j by
// topk_ids[t, j], stably: all pairs of expert 0 in increasing p, then expert 1, ... Row r of
// `permuted` is the x row of the r-th pair in that order; expert_offsets[e] is the first row of
// expert e (offsets[E] = T * k); inv_perm[p] = the row of pair p. The order is a function of the
// ids alone, so every kernel writes the same bits.
struct MoePermute {
  static constexpr const char* name = "moe_permute";
  using Signature = void(const TensorView& permuted, const TensorView& expert_offsets,
                         const TensorView& inv_perm, const TensorView& x,
                         const TensorView& topk_ids, int64_t num_experts);
  static constexpr ArgSpec args[] = {{"permuted", ArgRole::out},
                                     {"expert_offsets", ArgRole::out},
                                     {"inv_perm", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"topk_ids", ArgRole::in},
                                     {"num_experts", ArgRole::scalar, "8"}};
  static constexpr const char* doc =
      "MoE dispatch permutation (vLLM's moe_permute). x: [T, H] floating (rows may be padded); "
      "topk_ids: i32 [T, k] contiguous, each in [0, num_experts) (checked on the host; on a "
      "CUDA device the ids are not read by the check: a pair with an id out of range is placed "
      "after every expert's pairs, in rows [offsets[E], T * k) in increasing pair order, and "
      "counted by no expert, so offsets[E] counts the in-range pairs only). permuted: [T * k, "
      "H] of x's dtype, row r = x[p / k] for the r-th pair p in the stable expert order of Note"
      " [moe permutation]; expert_offsets: i64 [E + 1] prefix sums of the per-expert counts "
      "(offsets[0] = 0); inv_perm: i32 or i64 [T * k], the row of permuted holding pair p. Rows"
      " are copied bit for bit. expert_offsets and inv_perm are vLLM's "
      "expert_first_token_offset and inv_permuted_idx when every expert is local. Differs from "
      "vLLM: the order within an expert is fixed (increasing pair index; vLLM leaves it to its "
      "sort); no a1q_scale, expert_map / n_local_expert, align_block_size or m_indices; any "
      "hidden size (vLLM asserts rows of a multiple of 16 bytes).";
  static void check(const TensorView& permuted, const TensorView& expert_offsets,
                    const TensorView& inv_perm, const TensorView& x, const TensorView& topk_ids,
                    int64_t num_experts);
};

struct MoeUnpermute {
  static constexpr const char* name = "moe_unpermute";
  using Signature = void(const TensorView& y, const TensorView& expert_out,
                         const TensorView& inv_perm, const TensorView& topk_weights);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"expert_out", ArgRole::in},
                                     {"inv_perm", ArgRole::in},
                                     {"topk_weights", ArgRole::in}};
  static constexpr const char* doc =
      "MoE combine (vLLM's moe_unpermute). expert_out: [T * k, H] floating (rows may be padded); "
      "inv_perm: i32 or i64 [T * k] contiguous, each in [0, T * k) (checked on the host; on a "
      "CUDA device an out-of-range entry contributes nothing), need not be a permutation; "
      "topk_weights: f32 [T, k] contiguous. y: [T, H] of expert_out's dtype, y[t] = sum over j "
      "= 0..k-1 in that order of topk_weights[t, j] * expert_out[inv_perm[t * k + j]], "
      "accumulated in f32 and rounded once (the reference in f64). Differs from vLLM: no "
      "expert_map / valid-row masking, the weights are f32 whatever the activation dtype.";
  static void check(const TensorView& y, const TensorView& expert_out, const TensorView& inv_perm,
                    const TensorView& topk_weights);
};

void register_routing(Registry& reg);  // routing.cpp: ops, reference + cpu kernels, cases

}  // namespace opforge
