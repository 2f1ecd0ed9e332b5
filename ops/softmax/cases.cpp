// Harness cases of the softmax family (see Case in opforge/op.h).
//
// Rows are vocabulary-shaped where it matters: small and odd sizes, a medium 16 x 32000, large
// cases with vocab 32000 (Llama-2 / Mistral) and 128256 (Llama-3) for 16 and 1024 / 256 tokens
// (kept tractable for the reference), and edge cases: no rows, one element, sizes that are not a
// multiple of any vector width, a 3-d input, padded rows on inputs and outputs, in place.
// Forward x is N(0, 1) with outliers scaled by `x_scale`; backward dy is N(0, 1) and y is filled
// like the forward output of the op (probabilities, log-probabilities, or a sparse support).
#include <string>
#include <utility>

#include "ops/softmax/internal.h"

namespace opforge {

namespace {

struct Spec {
  bool backward = false;
  TensorInit y_init;  // backward only: the saved forward output
  double x_scale = 1;
};

struct Layout {
  int64_t input_pad = 0;
  int64_t output_pad = 0;
  bool in_place = false;
};

Case make_case(const Spec& spec, std::string label, CaseGroup group, const Shape& shape,
               Layout layout = {}) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  TensorInit in;
  in.shape = shape;
  in.row_pad = layout.input_pad;
  if (spec.backward) {
    in.fill = Fill::normal;
    TensorInit y = spec.y_init;
    y.shape = shape;
    y.row_pad = layout.input_pad;
    c.args.push_back({"dy", in});
    c.args.push_back({"y", y});
  } else {
    in.scale = spec.x_scale;
    c.args.push_back({"x", in});
  }
  const char* out = spec.backward ? "dx" : "y";
  if (layout.output_pad > 0) {
    TensorInit o;
    o.shape = shape;
    o.row_pad = layout.output_pad;
    c.args.push_back({out, o});
  }
  if (layout.in_place) c.in_place = {{out, spec.backward ? "dy" : "x"}};
  return c;
}

std::vector<Case> family_cases(const Spec& spec) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, Shape shape, Layout layout = {}) {
    cases.push_back(make_case(spec, std::move(label), group, shape, layout));
  };
  add("4x64", CaseGroup::small, {4, 64});
  add("7x33", CaseGroup::small, {7, 33});
  add("3x1000", CaseGroup::small, {3, 1000});
  add("16x4096", CaseGroup::medium, {16, 4096});
  add("16x32000", CaseGroup::medium, {16, 32000});
  add("1x128256", CaseGroup::medium, {1, 128256});  // one row over 256 blocks (Note [split softmax rows])
  add("t16xv32000", CaseGroup::large, {16, 32000});
  add("t1024xv32000", CaseGroup::large, {1024, 32000});
  add("t16xv128256", CaseGroup::large, {16, 128256});
  add("t256xv128256", CaseGroup::large, {256, 128256});
  add("0x64", CaseGroup::edge, {0, 64});
  add("1x1", CaseGroup::edge, {1, 1});
  add("3x67", CaseGroup::edge, {3, 67});
  add("5x4097", CaseGroup::edge, {5, 4097});
  add("2x3x40", CaseGroup::edge, {2, 3, 40});
  add("5x67_inputs_pad8", CaseGroup::edge, {5, 67}, {8, 0, false});
  add("5x67_outputs_pad5", CaseGroup::edge, {5, 67}, {0, 5, false});
  add("3x4097_all_pad3", CaseGroup::edge, {3, 4097}, {3, 3, false});
  add("7x33_in_place", CaseGroup::edge, {7, 33}, {0, 0, true});
  add("4x5000_in_place_pad8", CaseGroup::edge, {4, 5000}, {8, 0, true});
  // More rows than a GPU's SMs, each longer than its row kernel holds in registers: in place, with
  // padded rows (the forwards: Note [softmax row pipeline], one CTA a row; the backwards: Note
  // [many-row cluster]); then rows of 66,000, a row count no cluster count divides (bf16 / f16:
  // the many-row cluster, 8 CTAs a row; f32: the pipeline on clusters of 8). The latter is large:
  // 8.8 million elements, run when asked for (--group large), as the model-sized cases are.
  add("140x9000_in_place_pad8", CaseGroup::edge, {140, 9000}, {8, 0, true});
  add("133x66000", CaseGroup::large, {133, 66000});
  return cases;
}

TensorInit uniform(double low, double high) {
  TensorInit t;
  t.fill = Fill::uniform;
  t.low = low;
  t.high = high;
  return t;
}

}  // namespace

// softmax and log_softmax share their cases; x is scaled so rows have a peaked distribution.
std::vector<Case> softmax_forward_cases() { return family_cases({false, {}, 4.0}); }

// y like a forward output of a long row: probabilities well below 1 for softmax, log-probabilities
// in [-12, -4) for log_softmax (the formulas do not need y to be normalised to be checked).
std::vector<Case> softmax_backward_cases() { return family_cases({true, uniform(0.0, 0.01), 1}); }
std::vector<Case> log_softmax_backward_cases() {
  return family_cases({true, uniform(-12.0, -4.0), 1});
}

// Sparsemax of N(0, 1) rows has a small support; scaling by 0.05 widens it on short rows.
std::vector<Case> sparsemax_forward_cases() {
  std::vector<Case> cases = family_cases({false, {}, 1.0});
  for (double scale : {0.05, 0.001}) {
    Case c = make_case({false, {}, scale}, "7x33_scale" + std::to_string(scale), CaseGroup::small,
                       {7, 33});
    cases.push_back(std::move(c));
  }
  return cases;
}

// y in [-1, 1): about half the lanes are in the support (y > 0).
std::vector<Case> sparsemax_backward_cases() { return family_cases({true, uniform(-1.0, 1.0), 1}); }

}  // namespace opforge
