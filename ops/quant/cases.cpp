// Harness cases of quant_fp8 (see Case in opforge/op.h).
//
// x is [tokens, hidden] with N(0,1) activations and 1% outliers scaled 8-32x (the spread that
// makes per-token scales matter): small and odd sizes, a medium shape, large model shapes
// (hidden 4096; tokens 1 / 16 / 1024 / 16384) for each mode, and edge cases: no rows, one
// element, sizes that are not a multiple of any vector width, a 3-d input, padded rows on the
// input and on the outputs, a scale_ub that clamps, a static scale small enough that many
// values saturate at +-448, and all-zero rows (the minimum scale).
#include <string>

#include "ops/quant/internal.h"

namespace opforge {

namespace {

struct QuantShape {
  Shape shape;
  std::string mode = "per_tensor";
  double static_scale = 0;  // > 0: mode static with this scale
  double scale_ub = 0;
  int64_t input_pad = 0, output_pad = 0;
  Fill fill = Fill::normal_outliers;
};

Case quant_case(std::string label, CaseGroup group, const QuantShape& s) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  TensorInit x;
  x.shape = s.shape;
  x.row_pad = s.input_pad;
  x.fill = s.fill;
  c.args.push_back({"x", x});
  if (s.static_scale > 0) {
    TensorInit scale;
    scale.shape = Shape{1};
    scale.fill = Fill::values;
    scale.values = {s.static_scale};
    scale.fixed_dtype = true;
    scale.dtype = DType::f32;
    c.args.push_back({"static_scale", scale});
  }
  c.args.push_back({"mode", Value(std::string(s.static_scale > 0 ? "static" : s.mode))});
  c.args.push_back({"scale_ub", Value(s.scale_ub)});
  if (s.output_pad > 0) {
    TensorInit q;
    q.shape = s.shape;
    q.row_pad = s.output_pad;
    c.args.push_back({"q", q});
  }
  return c;
}

}  // namespace

std::vector<Case> quant_fp8_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, QuantShape s) {
    cases.push_back(quant_case(std::move(label), group, s));
  };
  const char* modes[] = {"per_tensor", "per_token"};
  for (const char* mode : modes) {
    const std::string m = mode;
    add("4x64_" + m, CaseGroup::small, {{4, 64}, m});
    add("7x33_" + m, CaseGroup::small, {{7, 33}, m});
    add("16x4096_" + m, CaseGroup::medium, {{16, 4096}, m});
    for (int64_t tokens : {1, 16, 1024, 16384})
      add("t" + std::to_string(tokens) + "xh4096_" + m, CaseGroup::large, {{tokens, 4096}, m});
    add("0x64_" + m, CaseGroup::edge, {{0, 64}, m});
    add("1x1_" + m, CaseGroup::edge, {{1, 1}, m});
    add("5x4097_" + m, CaseGroup::edge, {{5, 4097}, m});
    add("2x3x40_" + m, CaseGroup::edge, {{2, 3, 40}, m});
    add("5x67_pads_" + m, CaseGroup::edge, {{5, 67}, m, 0, 0, 8, 5});
    add("3x67_zeros_" + m, CaseGroup::edge, {{3, 67}, m, 0, 0, 0, 0, Fill::zeros});
  }
  add("7x33_static", CaseGroup::small, {{7, 33}, "static", 0.05});
  add("16x4096_static", CaseGroup::medium, {{16, 4096}, "static", 0.02});
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "xh4096_static", CaseGroup::large, {{tokens, 4096}, "static", 0.02});
  add("5x67_pads_static_saturating", CaseGroup::edge, {{5, 67}, "static", 0.004, 0, 8, 5});
  add("9x130_per_token_ub2", CaseGroup::edge, {{9, 130}, "per_token", 0, 2.0});
  return cases;
}

}  // namespace opforge
