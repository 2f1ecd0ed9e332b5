// Harness cases of the linear family (see Case in opforge/op.h).
//
// linear: small and medium shapes, large model shapes (hidden 4096, intermediate 14336; 1 / 16 /
// 128 / 512 tokens: the reference is a double loop, so token counts stay where it takes seconds),
// and edge cases: no rows, one element, odd sizes, in = 0, a 3-d x, padded rows on x, w and y.
// Weights are N(0, 1/in) as models initialise them, activations N(0, 1) with outliers.
// fused_linear_cross_entropy: the three reductions, label smoothing, with and without bias,
// ignored targets, a custom ignore_index that is a valid class, V = 1, no tokens, every token
// ignored, padded rows; large: vocab 32000 x hidden 4096 at 16 and 64 tokens.
#include <cmath>
#include <string>
#include <utility>

#include "ops/linear/internal.h"

namespace opforge {

namespace {

TensorInit matrix(Shape shape, int64_t row_pad = 0, double scale = 1.0,
                  Fill fill = Fill::normal_outliers) {
  TensorInit t;
  t.shape = shape;
  t.row_pad = row_pad;
  t.scale = scale;
  t.fill = fill;
  return t;
}

TensorInit weight(int64_t out, int64_t in, int64_t row_pad = 0) {
  return matrix(Shape{out, in}, row_pad, 1.0 / std::sqrt(double(std::max<int64_t>(in, 1))), Fill::normal);
}

struct LinearShape {
  Shape x;           // [..., in]
  int64_t out = 0;
  bool bias = true;
  int64_t x_pad = 0, w_pad = 0, y_pad = 0;
};

Case linear_case(bool backward, std::string label, CaseGroup group, const LinearShape& s) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  const int64_t in = s.x[s.x.ndim - 1];
  Shape y = s.x;
  y.dims[size_t(y.ndim - 1)] = s.out;
  c.args.push_back({"x", matrix(s.x, s.x_pad)});
  c.args.push_back({"w", weight(s.out, in, s.w_pad)});
  if (backward) {
    c.args.push_back({"dy", matrix(y, s.y_pad, 1.0, Fill::normal)});
  } else {
    if (s.bias) c.args.push_back({"b", matrix(Shape{s.out}, 0, 1.0, Fill::normal)});
    if (s.y_pad > 0) c.args.push_back({"y", matrix(y, s.y_pad)});
  }
  return c;
}

std::vector<Case> linear_family_cases(bool backward) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, LinearShape s) {
    cases.push_back(linear_case(backward, std::move(label), group, s));
  };
  add("4x64_to_32", CaseGroup::small, {{4, 64}, 32});
  add("7x33_to_5_no_bias", CaseGroup::small, {{7, 33}, 5, false});
  add("32x1024_to_768", CaseGroup::medium, {{32, 1024}, 768});
  // 16-bit w past half of a 2 MiB L2 with 12 rows: the cpu kernel's dot path (Note [decode gemv])
  add("12x1024_to_640", CaseGroup::medium, {{12, 1024}, 640});
  for (int64_t tokens : {1, 16, 128, 512})
    add("t" + std::to_string(tokens) + "_4096_to_4096", CaseGroup::large, {{tokens, 4096}, 4096, false});
  add("t16_4096_to_14336", CaseGroup::large, {{16, 4096}, 14336, false});
  add("t16_14336_to_4096", CaseGroup::large, {{16, 14336}, 4096, false});
  add("0x64_to_32", CaseGroup::edge, {{0, 64}, 32});
  add("1x1_to_1", CaseGroup::edge, {{1, 1}, 1});
  add("3x67_to_5", CaseGroup::edge, {{3, 67}, 5});
  add("5x0_to_3", CaseGroup::edge, {{5, 0}, 3});
  add("4x16_to_0", CaseGroup::edge, {{4, 16}, 0});
  add("2x3x40_to_7", CaseGroup::edge, {{2, 3, 40}, 7});
  add("5x67_to_9_x_pad8_w_pad3", CaseGroup::edge, {{5, 67}, 9, true, 8, 3, 0});
  add("5x67_to_9_y_pad5_no_bias", CaseGroup::edge, {{5, 67}, 9, false, 0, 0, 5});
  // Up to 4 rows: the cpu kernel's dot-product path (Note [decode gemv]), padded rows of x, w, y.
  add("2x67_to_9_pads_no_bias", CaseGroup::edge, {{2, 67}, 9, false, 8, 3, 5});
  add("4x1000_to_700_x_pad8", CaseGroup::edge, {{4, 1000}, 700, true, 8, 0, 0});
  return cases;
}

// ---- fused_linear_cross_entropy ----------------------------------------------------------------

struct FlceShape {
  int64_t tokens = 0, hidden = 0, vocab = 0;
  std::string reduction = "mean";
  double label_smoothing = 0.0;
  bool bias = false;
  int64_t ignore_index = -100;
  std::vector<double> targets;  // cycled; empty: uniform in [0, vocab)
  int64_t hidden_pad = 0, w_pad = 0;
};

// The forward, the backward (given lse and dloss) or both in one call (dloss only).
enum class FlceKind { forward, backward, with_grad };

Case flce_case(FlceKind kind, std::string label, CaseGroup group, const FlceShape& s) {
  const bool backward = kind == FlceKind::backward;
  Case c;
  c.label = std::move(label);
  c.group = group;
  // The backward reads a given lse (estimated below), so its hidden has no outliers: a row with
  // one would have logits far wider than the estimate assumes, and exp(z - lse) far above 1.
  c.args.push_back({"hidden", matrix(Shape{s.tokens, s.hidden}, s.hidden_pad, 1.0,
                                     backward ? Fill::normal : Fill::normal_outliers)});
  c.args.push_back({"w", weight(s.vocab, s.hidden, s.w_pad)});
  TensorInit target;
  target.shape = Shape{s.tokens};
  target.fixed_dtype = true;
  target.dtype = DType::i64;
  if (s.targets.empty()) {
    target.fill = Fill::integers;
    target.low = 0;
    target.high = double(s.vocab);
  } else {
    target.fill = Fill::values;
    target.values = s.targets;
  }
  c.args.push_back({"target", target});
  if (backward) {
    // The forward's lse: logits hidden . w^T (+ b) are about N(0, 1) (N(0, 2) with the bias) here,
    // and the lse of N(0, s^2) logits is about log V + s^2 / 2, so exp(z - lse) stays a
    // probability-sized value.
    TensorInit lse;
    lse.shape = Shape{s.tokens};
    lse.fill = Fill::uniform;
    lse.low = std::log(double(s.vocab)) + (s.bias ? 1.0 : 0.5);
    lse.high = lse.low + 0.25;
    c.args.push_back({"lse", lse});
  }
  if (s.bias) c.args.push_back({"b", matrix(Shape{s.vocab}, 0, 1.0, Fill::normal)});
  c.args.push_back({"ignore_index", Value(s.ignore_index)});
  c.args.push_back({"label_smoothing", Value(s.label_smoothing)});
  c.args.push_back({"reduction", Value(s.reduction)});
  if (kind != FlceKind::forward) {
    const Shape loss = s.reduction == "none" ? Shape{s.tokens} : Shape{};
    c.args.push_back({"dloss", matrix(loss, 0, 1.0, Fill::normal)});
  }
  return c;
}

std::vector<Case> flce_family_cases(FlceKind kind) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, FlceShape s) {
    cases.push_back(flce_case(kind, std::move(label), group, s));
  };
  const std::vector<double> some_ignored = {3, -100, 7, 0, 10, 5, -100, 1};
  for (const char* r : {"mean", "sum", "none"}) {
    FlceShape s{8, 24, 11, r, 0.0, false, -100, some_ignored};
    add(std::string("8x24_v11_") + r, CaseGroup::small, s);
    s.label_smoothing = 0.1;
    s.bias = true;
    add(std::string("8x24_v11_ls0.1_bias_") + r, CaseGroup::small, s);
  }
  add("64x512_v4096", CaseGroup::medium, {64, 512, 4096, "mean", 0.0, true});
  add("64x512_v4096_ls0.1_none", CaseGroup::medium, {64, 512, 4096, "none", 0.1});
  // More tokens than one chunk of the CUDA kernels (64 rows at this size, Note [flce cuda
  // chunks]): several chunks and a short last one.
  add("200x64_v1000_chunks_ls0.1_bias", CaseGroup::medium,
      {200, 64, 1000, "mean", 0.1, true, -100, some_ignored});
  add("200x64_v1000_chunks_none", CaseGroup::medium, {200, 64, 1000, "none", 0.0, false, -100, some_ignored});
  add("t16_h4096_v32000", CaseGroup::large, {16, 4096, 32000});
  add("t64_h4096_v32000", CaseGroup::large, {64, 4096, 32000});
  add("t8192_h4096_v128256", CaseGroup::training, {8192, 4096, 128256});  // Llama-3's head, a training step
  add("0x16_v5", CaseGroup::edge, {0, 16, 5});
  add("0x16_v5_sum", CaseGroup::edge, {0, 16, 5, "sum"});
  add("1x1_v1", CaseGroup::edge, {1, 1, 1, "mean", 0.0, true});
  add("5x67_v33_ls1_none", CaseGroup::edge, {5, 67, 33, "none", 1.0, true});
  add("4x8_v6_all_ignored", CaseGroup::edge, {4, 8, 6, "mean", 0.0, false, -100, {-100}});
  add("6x8_v6_ignore_index2", CaseGroup::edge, {6, 8, 6, "mean", 0.2, false, 2, {2, 0, 5, 2, 1, 3}});
  add("9x67_v131_hidden_pad8_w_pad3", CaseGroup::edge,
      {9, 67, 131, "sum", 0.05, true, -100, {}, 8, 3});
  return cases;
}

}  // namespace

std::vector<Case> linear_cases() { return linear_family_cases(false); }
std::vector<Case> linear_backward_cases() { return linear_family_cases(true); }
std::vector<Case> fused_linear_cross_entropy_cases() { return flce_family_cases(FlceKind::forward); }
std::vector<Case> fused_linear_cross_entropy_backward_cases() { return flce_family_cases(FlceKind::backward); }
std::vector<Case> fused_linear_cross_entropy_with_grad_cases() { return flce_family_cases(FlceKind::with_grad); }

}  // namespace opforge
