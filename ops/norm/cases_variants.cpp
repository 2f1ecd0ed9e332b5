// Harness cases of rms_norm_gated and poly_norm (and their backward ops); the Gemma ops take
// rms_norm's cases (cases.cpp).
//
// Shapes as the rest of the family: small, medium (16 x 4096), large model shapes (hidden 4096,
// tokens 1 / 16 / 1024 / 16384) and edge cases (no rows, one element, odd sizes, a 3-d input,
// padded rows, in place for the forward ops). rms_norm_gated's large cases use groups of 512, as
// Mamba-2 layers with 8 groups over 4096 channels; its small and edge cases cover both gate
// positions, both activations and whole-row groups.
#include <string>
#include <utility>

#include "ops/norm/internal.h"

namespace opforge {

namespace {

struct GatedOptions {
  int64_t group_size = 0;
  bool norm_before_gate = false;
  const char* activation = "silu";
};

struct Layout {
  int64_t input_pad = 0;
  int64_t output_pad = 0;
};

// One case: row inputs of `shape`, the op's parameters (`params`), padded outputs when asked.
Case row_case(const std::vector<const char*>& row_inputs, const std::vector<const char*>& row_outputs,
              std::string label, CaseGroup group, const Shape& shape, Layout layout,
              std::vector<CaseArg> params) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  for (const char* name : row_inputs) {
    TensorInit t;
    t.shape = shape;
    t.row_pad = layout.input_pad;
    c.args.push_back({name, t});
  }
  for (CaseArg& p : params) c.args.push_back(std::move(p));
  if (layout.output_pad > 0) {
    for (const char* name : row_outputs) {
      TensorInit t;
      t.shape = shape;
      t.row_pad = layout.output_pad;
      c.args.push_back({name, t});
    }
  }
  return c;
}

std::vector<CaseArg> gated_params(const Shape& shape, const GatedOptions& o) {
  TensorInit w;
  w.shape = Shape{shape[shape.ndim - 1]};
  w.fill = Fill::uniform_positive;
  return {{"w", w},
          {"eps", Value(1e-5)},
          {"group_size", Value(o.group_size)},
          {"norm_before_gate", Value(o.norm_before_gate)},
          {"activation", Value(std::string(o.activation))}};
}

std::vector<Case> gated_cases(const std::vector<const char*>& inputs,
                              const std::vector<const char*>& outputs, bool in_place) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, Shape shape, GatedOptions o,
                 Layout layout = {}) {
    cases.push_back(row_case(inputs, outputs, std::move(label), group, shape, layout,
                             gated_params(shape, o)));
  };
  add("4x64_silu", CaseGroup::small, {4, 64}, {});
  add("7x33_sigmoid_norm_first", CaseGroup::small, {7, 33}, {0, true, "sigmoid"});
  add("4x64_g16_silu_norm_first", CaseGroup::small, {4, 64}, {16, true, "silu"});
  add("6x96_g32_swish", CaseGroup::small, {6, 96}, {32, false, "swish"});
  add("3x60_g12_sigmoid", CaseGroup::small, {3, 60}, {12, false, "sigmoid"});
  add("16x4096_g512", CaseGroup::medium, {16, 4096}, {512, false, "silu"});
  add("16x4096_norm_first", CaseGroup::medium, {16, 4096}, {0, true, "silu"});
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "xh4096_g512", CaseGroup::large, {tokens, 4096},
        {512, false, "silu"});
  add("0x64", CaseGroup::edge, {0, 64}, {});
  add("1x1", CaseGroup::edge, {1, 1}, {});
  add("3x67", CaseGroup::edge, {3, 67}, {0, true, "sigmoid"});
  add("5x4097", CaseGroup::edge, {5, 4097}, {});
  add("2x3x40_g8", CaseGroup::edge, {2, 3, 40}, {8, true, "silu"});
  add("5x67_inputs_pad8", CaseGroup::edge, {5, 67}, {}, {8, 0});
  add("5x70_g7_outputs_pad5", CaseGroup::edge, {5, 70}, {7, false, "sigmoid"}, {0, 5});
  add("3x4097_all_pad3", CaseGroup::edge, {3, 4097}, {0, true, "silu"}, {3, 3});
  if (in_place) {
    add("7x33_in_place", CaseGroup::edge, {7, 33}, {});
    cases.back().in_place = {{"y", "x"}};
    add("16x4096_g256_in_place_pad8", CaseGroup::edge, {16, 4096}, {256, true, "silu"}, {8, 0});
    cases.back().in_place = {{"y", "x"}};
  }
  return cases;
}

std::vector<CaseArg> poly_params(bool with_bias) {
  TensorInit w;
  w.shape = Shape{3};
  w.fill = Fill::uniform_positive;
  std::vector<CaseArg> p = {{"w", w}};
  if (with_bias) {
    TensorInit b;
    b.shape = Shape{1};
    b.fill = Fill::normal;
    p.push_back({"b", b});
  }
  p.push_back({"eps", Value(1e-6)});
  return p;
}

std::vector<Case> poly_cases(const std::vector<const char*>& inputs,
                             const std::vector<const char*>& outputs, bool forward) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, Shape shape, Layout layout = {}) {
    cases.push_back(
        row_case(inputs, outputs, std::move(label), group, shape, layout, poly_params(forward)));
  };
  add("4x64", CaseGroup::small, {4, 64});
  add("7x33", CaseGroup::small, {7, 33});
  add("16x4096", CaseGroup::medium, {16, 4096});
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "xh4096", CaseGroup::large, {tokens, 4096});
  add("0x64", CaseGroup::edge, {0, 64});
  add("1x1", CaseGroup::edge, {1, 1});
  add("3x67", CaseGroup::edge, {3, 67});
  add("5x4097", CaseGroup::edge, {5, 4097});
  add("2x3x40", CaseGroup::edge, {2, 3, 40});
  add("5x67_inputs_pad8", CaseGroup::edge, {5, 67}, {8, 0});
  add("5x67_outputs_pad5", CaseGroup::edge, {5, 67}, {0, 5});
  add("3x4097_all_pad3", CaseGroup::edge, {3, 4097}, {3, 3});
  if (forward) {
    add("7x33_in_place", CaseGroup::edge, {7, 33});
    cases.back().in_place = {{"y", "x"}};
    add("16x4096_in_place_pad8", CaseGroup::edge, {16, 4096}, {8, 0});
    cases.back().in_place = {{"y", "x"}};
  }
  return cases;
}

}  // namespace

std::vector<Case> rms_norm_gated_cases() { return gated_cases({"x", "z"}, {"y"}, true); }
std::vector<Case> rms_norm_gated_backward_cases() {
  return gated_cases({"dy", "x", "z"}, {"dx", "dz"}, false);
}
std::vector<Case> poly_norm_cases() { return poly_cases({"x"}, {"y"}, true); }
std::vector<Case> poly_norm_backward_cases() { return poly_cases({"dy", "x"}, {"dx"}, false); }

}  // namespace opforge
