// Harness cases of the routing family (see Case in opforge/op.h).
//
// topk_softmax: gating logits [T, E] with 128 experts and k = 8 for the medium and large groups
// (tokens 1 / 16 / 1024 / 16384), Mixtral's 8 experts with k = 2 among the small ones; edge cases:
// no tokens, one expert, k = E, padded rows, and integer logits in [-2, 2] so that many keys tie
// (Note [routing ties] decides). grouped_topk: DeepSeek-V3's routing (256 experts in 8 groups,
// 4 groups kept, k = 8, sigmoid, correction bias, scaling 2.5) for the large group,
// DeepSeek-V2's (160 experts, 8 groups, 3 kept, k = 6, softmax, no bias) and the odd corners.
#include <string>

#include "ops/routing/internal.h"

namespace opforge {

namespace {

struct LogitsShape {
  int64_t tokens, experts;
  int64_t pad = 0, out_pad = 0;
  bool ties = false;
};

void add_logits(Case& c, const LogitsShape& s, int64_t topk) {
  TensorInit x;
  x.shape = Shape{s.tokens, s.experts};
  x.row_pad = s.pad;
  if (s.ties) {
    x.fill = Fill::integers;
    x.low = -2;
    x.high = 3;
  }
  c.args.push_back({"gating_output", x});
  if (s.out_pad > 0) {
    TensorInit w;
    w.shape = Shape{s.tokens, topk};
    w.row_pad = s.out_pad;
    c.args.push_back({"topk_weights", w});
    c.args.push_back({"topk_ids", w});
  }
}

Case topk_case(std::string label, CaseGroup group, const LogitsShape& s, int64_t topk, bool renormalize) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  add_logits(c, s, topk);
  c.args.push_back({"topk", Value(topk)});
  c.args.push_back({"renormalize", Value(renormalize)});
  return c;
}

struct GroupedSpec {
  int64_t topk, groups, topk_group;
  bool sigmoid, bias, renormalize;
  double scaling = 1.0;
};

Case grouped_case(std::string label, CaseGroup group, const LogitsShape& s, const GroupedSpec& g) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  add_logits(c, s, g.topk);
  if (g.bias) {
    TensorInit b;
    b.shape = Shape{s.experts};
    b.fill = Fill::uniform;
    b.low = -0.2;
    b.high = 0.2;
    b.fixed_dtype = true;
    b.dtype = DType::f32;
    c.args.push_back({"e_score_correction_bias", b});
  }
  c.args.push_back({"topk", Value(g.topk)});
  c.args.push_back({"renormalize", Value(g.renormalize)});
  c.args.push_back({"num_expert_group", Value(g.groups)});
  c.args.push_back({"topk_group", Value(g.topk_group)});
  c.args.push_back({"scoring_func", Value(std::string(g.sigmoid ? "sigmoid" : "softmax"))});
  c.args.push_back({"routed_scaling_factor", Value(g.scaling)});
  return c;
}

}  // namespace

std::vector<Case> topk_softmax_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, LogitsShape s, int64_t k, bool renorm) {
    cases.push_back(topk_case(std::move(label), group, s, k, renorm));
  };
  add("4x8_k2", CaseGroup::small, {4, 8}, 2, false);
  add("7x33_k3_renorm", CaseGroup::small, {7, 33}, 3, true);
  add("16x128_k8", CaseGroup::medium, {16, 128}, 8, false);
  add("16x128_k8_renorm", CaseGroup::medium, {16, 128}, 8, true);
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "_e128_k8", CaseGroup::large, {tokens, 128}, 8, true);
  add("0x8_k2", CaseGroup::edge, {0, 8}, 2, false);
  add("1x1_k1", CaseGroup::edge, {1, 1}, 1, true);
  add("5x7_k7_renorm", CaseGroup::edge, {5, 7}, 7, true);
  add("9x37_k5_pads", CaseGroup::edge, {9, 37, 8, 3}, 5, false);
  add("33x64_k8_ties", CaseGroup::edge, {33, 64, 0, 0, true}, 8, true);
  return cases;
}

std::vector<Case> grouped_topk_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, LogitsShape s, GroupedSpec g) {
    cases.push_back(grouped_case(std::move(label), group, s, g));
  };
  const GroupedSpec v3{8, 8, 4, true, true, true, 2.5};
  const GroupedSpec v2{6, 8, 3, false, false, false, 16.0};
  add("4x16_g4_keep2_k3_softmax", CaseGroup::small, {4, 16}, {3, 4, 2, false, false, true});
  add("5x32_g4_keep2_k4_sigmoid_bias", CaseGroup::small, {5, 32}, {4, 4, 2, true, true, true, 2.5});
  add("16x160_deepseek_v2", CaseGroup::medium, {16, 160}, v2);
  add("16x256_deepseek_v3", CaseGroup::medium, {16, 256}, v3);
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "_e256_deepseek_v3", CaseGroup::large, {tokens, 256}, v3);
  add("0x16_g4", CaseGroup::edge, {0, 16}, {3, 4, 2, true, true, true});
  add("1x4_g4_keep1_k1", CaseGroup::edge, {1, 4}, {1, 4, 1, false, false, false});
  add("3x6_g1_k6_sigmoid_bias", CaseGroup::edge, {3, 6}, {6, 1, 1, true, true, true, 1.5});
  add("7x24_g3_keep3_k5_softmax_bias", CaseGroup::edge, {7, 24}, {5, 3, 3, false, true, false});
  add("9x40_g8_keep2_k10_pads", CaseGroup::edge, {9, 40, 8, 3}, {10, 8, 2, true, true, true});
  add("33x64_g8_keep4_k8_ties", CaseGroup::edge, {33, 64, 0, 0, true}, {8, 8, 4, false, false, true});
  add("33x64_g8_keep4_k8_ties_bias", CaseGroup::edge, {33, 64, 0, 0, true}, {8, 8, 4, true, true, true});
  return cases;
}

}  // namespace opforge
