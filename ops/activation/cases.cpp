// Harness cases of the activation family (see Case in opforge/op.h).
//
// x is [tokens, 2d]: small and odd sizes, a medium shape, large model shapes with the Llama-3-8B
// intermediate size (d = 14336, x = [tokens, 28672]; tokens 1 / 16 / 1024 / 16384), and edge
// cases: no rows, one gated pair, d not a multiple of any vector width, a 3-d input, padded rows.
#include <string>

#include "ops/activation/internal.h"

namespace opforge {

namespace {

struct Layout {
  int64_t input_pad = 0;
  int64_t output_pad = 0;
};

// `backward`: dy ([..., d]) is an input and the output is dx; else the output is y.
Case gated_case(bool backward, std::string label, CaseGroup group, const Shape& x_shape,
                Layout layout = {}) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  Shape half = x_shape;
  half.dims[size_t(half.ndim - 1)] /= 2;
  auto row_tensor = [](const Shape& shape, int64_t pad) {
    TensorInit t;
    t.shape = shape;
    t.row_pad = pad;
    return t;
  };
  if (backward) c.args.push_back({"dy", row_tensor(half, layout.input_pad)});
  c.args.push_back({"x", row_tensor(x_shape, layout.input_pad)});
  if (layout.output_pad > 0) {
    if (backward) c.args.push_back({"dx", row_tensor(x_shape, layout.output_pad)});
    else c.args.push_back({"y", row_tensor(half, layout.output_pad)});
  }
  return c;
}

std::vector<Case> gated_cases(bool backward) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, Shape x_shape, Layout layout = {}) {
    cases.push_back(gated_case(backward, std::move(label), group, x_shape, layout));
  };
  add("4x2x64", CaseGroup::small, {4, 128});
  add("7x2x33", CaseGroup::small, {7, 66});
  add("16x2x4096", CaseGroup::medium, {16, 8192});
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "xi14336", CaseGroup::large, {tokens, 2 * 14336});
  add("0x2x64", CaseGroup::edge, {0, 128});
  add("1x2x1", CaseGroup::edge, {1, 2});
  add("3x2x67", CaseGroup::edge, {3, 134});
  add("5x2x4097", CaseGroup::edge, {5, 8194});
  add("2x3x2x20", CaseGroup::edge, {2, 3, 40});
  add("5x2x67_inputs_pad8", CaseGroup::edge, {5, 134}, {8, 0});
  add("5x2x67_outputs_pad5", CaseGroup::edge, {5, 134}, {0, 5});
  add("3x2x4097_all_pad3", CaseGroup::edge, {3, 8194}, {3, 3});
  return cases;
}

}  // namespace

std::vector<Case> silu_and_mul_cases() { return gated_cases(false); }
std::vector<Case> silu_and_mul_backward_cases() { return gated_cases(true); }

}  // namespace opforge
