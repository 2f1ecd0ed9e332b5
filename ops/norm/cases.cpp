// Harness cases of the norm family (see Case in opforge/op.h).
//
// Every op gets the same shapes: small, medium (16 x 4096), large model shapes (hidden 4096,
// tokens 1 / 16 / 1024 / 16384), and edge cases: no rows, one element, sizes that are not a
// multiple of any vector width, a 3-d input, padded (strided) rows on inputs and on outputs, and
// for the forward ops the in-place form (y over x; s over residual).
// Weights are U(0.5, 1.5); activations N(0, 1) with outliers.
#include <string>
#include <utility>

#include "ops/norm/internal.h"

namespace opforge {

namespace {

// Which arguments of an op are row tensors (shape of x) and which are outputs.
struct NormArgs {
  std::vector<const char*> row_inputs;   // e.g. {"x"} or {"dy", "ds", "x", "residual"}
  std::vector<const char*> row_outputs;  // listed only when a case pads them
  std::vector<std::pair<std::string, std::string>> in_place;  // (output, input) the op allows
  bool has_offset = true;  // false: the Gemma ops (offset fixed at 1, w around 0 as Gemma's)
};

struct Layout {
  int64_t input_pad = 0;
  int64_t output_pad = 0;
};

Case norm_case(const NormArgs& spec, std::string label, CaseGroup group, const Shape& shape,
               double offset = 0.0, Layout layout = {}) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  for (const char* name : spec.row_inputs) {
    TensorInit t;
    t.shape = shape;
    t.row_pad = layout.input_pad;
    c.args.push_back({name, t});
  }
  TensorInit w;
  w.shape = Shape{shape[shape.ndim - 1]};
  w.fill = spec.has_offset ? Fill::uniform_positive : Fill::uniform;
  w.low = -0.5;
  w.high = 0.5;
  c.args.push_back({"w", w});
  if (layout.output_pad > 0) {
    for (const char* name : spec.row_outputs) {
      TensorInit t;
      t.shape = shape;
      t.row_pad = layout.output_pad;
      c.args.push_back({name, t});
    }
  }
  c.args.push_back({"eps", Value(1e-6)});
  if (spec.has_offset) c.args.push_back({"offset", Value(offset)});
  return c;
}

std::vector<Case> norm_cases(const NormArgs& spec) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, Shape shape, double offset = 0.0,
                 Layout layout = {}) {
    if (!spec.has_offset && offset != 0.0) return;  // the Gemma ops have no offset argument
    cases.push_back(norm_case(spec, std::move(label), group, shape, offset, layout));
  };
  add("4x64", CaseGroup::small, {4, 64});
  add("7x33", CaseGroup::small, {7, 33});
  add("7x33_offset1", CaseGroup::small, {7, 33}, 1.0);
  add("16x4096", CaseGroup::medium, {16, 4096});
  add("16x4096_offset1", CaseGroup::medium, {16, 4096}, 1.0);
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "xh4096", CaseGroup::large, {tokens, 4096});
  add("0x64", CaseGroup::edge, {0, 64});
  add("1x1", CaseGroup::edge, {1, 1});
  add("3x67", CaseGroup::edge, {3, 67});
  add("5x4097", CaseGroup::edge, {5, 4097});
  add("2x3x40", CaseGroup::edge, {2, 3, 40});
  add("5x67_inputs_pad8", CaseGroup::edge, {5, 67}, 0.0, {8, 0});
  add("5x67_outputs_pad5", CaseGroup::edge, {5, 67}, spec.has_offset ? 1.0 : 0.0, {0, 5});
  add("3x4097_all_pad3", CaseGroup::edge, {3, 4097}, 0.0, {3, 3});
  // Shapes of the CUDA backward's few-row cluster (Note [few-row backward cluster]): two rows a
  // thread (16 x 8192, 48 x 1024) and a last CTA with fewer columns (9 x 4104 bf16: 513 packs).
  add("16x8192", CaseGroup::edge, {16, 8192});
  add("48x1024", CaseGroup::edge, {48, 1024});
  add("9x4104", CaseGroup::edge, {9, 4104});
  if (!spec.in_place.empty()) {  // outputs written over their inputs (vLLM's in-place form)
    add("7x33_in_place", CaseGroup::edge, {7, 33});
    cases.back().in_place = spec.in_place;
    add("16x4096_in_place_pad8", CaseGroup::edge, {16, 4096}, spec.has_offset ? 1.0 : 0.0, {8, 0});
    cases.back().in_place = spec.in_place;
  }
  return cases;
}

// The backward ops add rows enough for the CUDA kernel's bulk-copy pipeline (Note [bulk-copy row
// pipeline]: from 16 rows an SM on, 2,112 on an H100 / H200), about five rows a block at hidden
// 2,048 bf16, so each block's ring of four stages wraps.
std::vector<Case> backward_cases(const NormArgs& spec) {
  std::vector<Case> cases = norm_cases(spec);
  cases.push_back(norm_case(spec, "2400x2048_bulk_rows", CaseGroup::edge, {2400, 2048},
                            spec.has_offset ? 1.0 : 0.0, {}));
  // At least as many rows as SMs, whose dw the CUDA backward sums by columns (Note [column dw]):
  // an odd number of packs (1000 bf16: 125), and more rows than a column unit's row lanes.
  cases.push_back(norm_case(spec, "133x1000", CaseGroup::edge, {133, 1000}, 0.0, {}));
  cases.push_back(norm_case(spec, "600x1000", CaseGroup::edge, {600, 1000}, 0.0, {}));
  return cases;
}

}  // namespace

std::vector<Case> rms_norm_cases() { return norm_cases({{"x"}, {"y"}, {{"y", "x"}}}); }

std::vector<Case> rms_norm_backward_cases() { return backward_cases({{"dy", "x"}, {"dx"}}); }

std::vector<Case> fused_add_rms_norm_cases() {
  return norm_cases({{"x", "residual"}, {"y", "s"}, {{"y", "x"}, {"s", "residual"}}});
}

std::vector<Case> fused_add_rms_norm_backward_cases() {
  return backward_cases({{"dy", "ds", "x", "residual"}, {"dx", "dresidual"}});
}

std::vector<Case> gemma_rms_norm_cases() { return norm_cases({{"x"}, {"y"}, {{"y", "x"}}, false}); }

std::vector<Case> gemma_rms_norm_backward_cases() {
  return backward_cases({{"dy", "x"}, {"dx"}, {}, false});
}

std::vector<Case> gemma_fused_add_rms_norm_cases() {
  return norm_cases({{"x", "residual"}, {"y", "s"}, {{"y", "x"}, {"s", "residual"}}, false});
}

std::vector<Case> gemma_fused_add_rms_norm_backward_cases() {
  return backward_cases({{"dy", "ds", "x", "residual"}, {"dx", "dresidual"}, {}, false});
}

}  // namespace opforge
