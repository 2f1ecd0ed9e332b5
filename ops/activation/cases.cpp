// Harness cases of the activation family (see Case in opforge/op.h).
//
// Gated ops: x is [tokens, 2d]: small and odd sizes, a medium shape, large model shapes with the
// Llama-3-8B intermediate size (d = 14336, x = [tokens, 28672]; tokens 1 / 16 / 1024 / 16384),
// and edge cases: no rows, one gated pair, d not a multiple of any vector width, a 3-d input,
// padded rows. Pointwise ops: x is [tokens, 14336] (the MLP activation) for the large group, the
// same small / edge shapes, and in-place calls (y = x, dx = dy).
#include <string>

#include "ops/activation/internal.h"

namespace opforge {

namespace {

struct Layout {
  int64_t input_pad = 0;
  int64_t output_pad = 0;
};

TensorInit row_tensor(const Shape& shape, int64_t pad) {
  TensorInit t;
  t.shape = shape;
  t.row_pad = pad;
  return t;
}

// `backward`: dy is an input and the output is dx; else the output is y. `gated`: y and dy are
// x with the last dim halved.
Case make_case(bool gated, bool backward, std::string label, CaseGroup group, const Shape& x_shape,
               const std::vector<CaseArg>& scalars, Layout layout) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  Shape y_shape = x_shape;
  if (gated) y_shape.dims[size_t(y_shape.ndim - 1)] /= 2;
  if (backward) c.args.push_back({"dy", row_tensor(y_shape, layout.input_pad)});
  c.args.push_back({"x", row_tensor(x_shape, layout.input_pad)});
  if (layout.output_pad > 0) {
    if (backward) c.args.push_back({"dx", row_tensor(x_shape, layout.output_pad)});
    else c.args.push_back({"y", row_tensor(y_shape, layout.output_pad)});
  }
  for (const CaseArg& s : scalars) c.args.push_back(s);
  return c;
}

// Shapes are given as the shape of the output of the forward op's last dim for gated ops
// (d), so both families share one table.
std::vector<Case> cases_of(bool gated, bool backward, const std::vector<CaseArg>& scalars) {
  std::vector<Case> cases;
  const int64_t k = gated ? 2 : 1;  // x's last dim per output column
  const std::string mid = gated ? "x2x" : "x";
  auto add = [&](std::string label, CaseGroup group, Shape out_shape, Layout layout = {}) {
    Shape x_shape = out_shape;
    x_shape.dims[size_t(x_shape.ndim - 1)] *= k;
    cases.push_back(make_case(gated, backward, std::move(label), group, x_shape, scalars, layout));
  };
  add("4" + mid + "64", CaseGroup::small, {4, 64});
  add("7" + mid + "33", CaseGroup::small, {7, 33});
  add("16" + mid + "4096", CaseGroup::medium, {16, 4096});
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "xi14336", CaseGroup::large, {tokens, 14336});
  add("0" + mid + "64", CaseGroup::edge, {0, 64});
  add("1" + mid + "1", CaseGroup::edge, {1, 1});
  add("3" + mid + "67", CaseGroup::edge, {3, 67});
  add("5" + mid + "4097", CaseGroup::edge, {5, 4097});
  add("2x3" + mid + "20", CaseGroup::edge, {2, 3, 20});
  add("5" + mid + "67_inputs_pad8", CaseGroup::edge, {5, 67}, {8, 0});
  add("5" + mid + "67_outputs_pad5", CaseGroup::edge, {5, 67}, {0, 5});
  add("3" + mid + "4097_all_pad3", CaseGroup::edge, {3, 4097}, {3, 3});
  if (!gated) {
    // In place: the output is the input's buffer (y = x forward, dx = dy backward).
    add("5x4099_in_place", CaseGroup::edge, {5, 4099});
    add("3x67_in_place_pad3", CaseGroup::edge, {3, 67}, {3, 0});
    // Enough rows for the CUDA kernel's two rows a thread, an odd count, padded rows.
    add("257x72_in_place_pad8", CaseGroup::edge, {257, 72}, {8, 0});
    for (size_t i = cases.size() - 3; i < cases.size(); ++i) {
      if (backward) cases[i].in_place = {{"dx", "dy"}};
      else cases[i].in_place = {{"y", "x"}};
    }
  }
  return cases;
}

}  // namespace

std::vector<Case> gated_cases(bool backward, const std::vector<CaseArg>& scalars) {
  return cases_of(true, backward, scalars);
}
std::vector<Case> pointwise_cases(bool backward, const std::vector<CaseArg>& scalars) {
  return cases_of(false, backward, scalars);
}

}  // namespace opforge
