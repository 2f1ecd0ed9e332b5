// Harness cases of the loss family (see Case in opforge/op.h).
//
// cross_entropy, cross_entropy_backward and cross_entropy_with_grad share their cases (ce_specs).
// Shapes are [tokens, vocab]: small and odd sizes, medium 16 x 32000, large cases with vocab
// 32000 (Llama-2 / Mistral) and 128256 (Llama-3) for 16..1024 tokens (the 1024 x 128256 case is
// cross_entropy's alone, to keep the reference tractable), and edge cases: no rows, one element,
// sizes that are not a multiple of any vector width, padded rows, ignored rows (all of them too).
// Every option is exercised on small shapes: each reduction, label smoothing, z-loss, softcap,
// log_target, beta in {0, 0.1, 0.5, 1}, labels with ignore_index.
#include <cmath>
#include <string>
#include <utility>

#include "ops/loss/internal.h"

namespace opforge {

namespace {

TensorInit matrix(int64_t rows, int64_t vocab, Fill fill, double low = 0, double high = 1,
                  int64_t pad = 0) {
  TensorInit t;
  t.shape = Shape{rows, vocab};
  t.fill = fill;
  t.low = low;
  t.high = high;
  t.row_pad = pad;
  return t;
}

// int64 [rows]: uniform ids in [0, vocab), or the explicit `values` cycled.
TensorInit ids(int64_t rows, int64_t vocab, std::vector<double> values = {}) {
  TensorInit t;
  t.shape = Shape{rows};
  t.fixed_dtype = true;
  t.dtype = DType::i64;
  if (values.empty()) {
    t.fill = Fill::integers;
    t.low = 0;
    t.high = double(vocab);
  } else {
    t.fill = Fill::values;
    t.values = std::move(values);
  }
  return t;
}

TensorInit upstream(const Shape& shape) {
  TensorInit t;
  t.shape = shape;
  t.fill = Fill::normal;
  return t;
}

Shape loss_shape(const std::string& reduction, int64_t rows, int64_t vocab, bool per_element) {
  if (reduction != "none") return Shape{1};
  return per_element ? Shape{rows, vocab} : Shape{rows};
}

// ---- cross_entropy ----------------------------------------------------------------------------
struct CeSpec {
  std::string label;
  CaseGroup group;
  int64_t rows, vocab;
  std::string reduction = "mean";
  double label_smoothing = 0, lse_square_scale = 0, softcap = 0;
  std::vector<double> targets;  // explicit targets (with ignore_index), else uniform ids
  int64_t ignore_index = -100;
  int64_t pad = 0;
  double scale = 1;  // logits scale (softcap cases push logits into tanh's bend)
};

std::vector<CeSpec> ce_specs() {
  std::vector<CeSpec> s;
  s.push_back({"4x64", CaseGroup::small, 4, 64});
  s.push_back({"7x33_none", CaseGroup::small, 7, 33, "none"});
  s.push_back({"8x100_sum_ignore", CaseGroup::small, 8, 100, "sum", 0, 0, 0, {3, -100, 7, 99, -100, 12}});
  s.push_back({"8x100_mean_ignore", CaseGroup::small, 8, 100, "mean", 0, 0, 0, {3, -100, 7, 0, 1, 12}});
  s.push_back({"7x33_smoothing", CaseGroup::small, 7, 33, "mean", 0.1});
  s.push_back({"7x33_zloss", CaseGroup::small, 7, 33, "sum", 0, 1e-3});
  s.push_back({"7x33_softcap", CaseGroup::small, 7, 33, "none", 0, 0, 8.0, {}, -100, 0, 4.0});
  s.push_back({"9x70_all_options", CaseGroup::small, 9, 70, "mean", 0.2, 1e-2, 12.0, {5, -100, 69, 0}, -100, 0, 3.0});
  s.push_back({"16x4096_none", CaseGroup::medium, 16, 4096, "none"});
  s.push_back({"16x32000", CaseGroup::medium, 16, 32000});
  s.push_back({"16x32000_all_options", CaseGroup::medium, 16, 32000, "mean", 0.1, 1e-4, 30.0, {}, -100, 0, 4.0});
  // Rows split over several blocks on a GPU (few rows, long vocab), with ignored rows and padding.
  s.push_back({"24x20000_none_ignore_pad8", CaseGroup::medium, 24, 20000, "none", 0, 0, 0, {5, -100, 19999, 0}, -100, 8});
  for (auto [tokens, vocab] : {std::pair<int64_t, int64_t>{16, 32000}, {1024, 32000}, {16, 128256}, {1024, 128256}})
    s.push_back({"t" + std::to_string(tokens) + "xv" + std::to_string(vocab), CaseGroup::large, tokens, vocab});
  s.push_back({"t8192xv128256", CaseGroup::training, 8192, 128256});  // a training step of Llama-3
  s.push_back({"0x64", CaseGroup::edge, 0, 64});
  s.push_back({"0x64_sum", CaseGroup::edge, 0, 64, "sum"});
  s.push_back({"1x1", CaseGroup::edge, 1, 1});
  s.push_back({"3x67_none", CaseGroup::edge, 3, 67, "none"});
  s.push_back({"5x4097_sum_smoothing", CaseGroup::edge, 5, 4097, "sum", 0.3});
  s.push_back({"5x67_pad8", CaseGroup::edge, 5, 67, "none", 0, 0, 0, {}, -100, 8});
  s.push_back({"4x40_all_ignored_sum", CaseGroup::edge, 4, 40, "sum", 0, 0, 0, {-100}});
  s.push_back({"4x40_all_ignored_mean", CaseGroup::edge, 4, 40, "mean", 0, 0, 0, {-100}});
  s.push_back({"6x40_ignore_index_0", CaseGroup::edge, 6, 40, "none", 0, 0, 0, {0, 5, 0, 39}, 0});
  // Few rows of a few thousand: a GPU row cut over a cluster of CTAs, with ignored rows, the
  // reductions and the options.
  s.push_back({"12x5000_mean_ignore", CaseGroup::edge, 12, 5000, "mean", 0, 0, 0, {3, -100, 4999, 0, -100, 17}});
  s.push_back({"6x4096_all_ignored_mean", CaseGroup::edge, 6, 4096, "mean", 0, 0, 0, {-100}});
  s.push_back({"3x20008_sum_all_options", CaseGroup::edge, 3, 20008, "sum", 0.1, 1e-3, 20.0, {7, -100, 20007}, -100, 0, 3.0});
  // Sixteen blocks a row on a GPU of 128 SMs or more (bf16: 5,000 packs a row), an ignored row.
  s.push_back({"8x40000_mean_smoothing_ignore", CaseGroup::edge, 8, 40000, "mean", 0.05, 0, 0, {11, 39999, -100, 0}});
  // More rows than a GPU's SMs, each longer than 1,024 16-byte units: the row kernels' long-row
  // path (the forward's: Note [cross_entropy row pipeline]), rows padded, some ignored, every
  // option.
  s.push_back({"140x9000_mean_all_options_pad8", CaseGroup::edge, 140, 9000, "mean", 0.1, 1e-3, 20.0,
               {7, -100, 8999, 0, 4500}, -100, 8, 3.0});
  // Several rows a block in the GPU row kernel (Note [row threads]) with a partial last block.
  s.push_back({"137x3000_sum_ignore", CaseGroup::edge, 137, 3000, "sum", 0, 0, 0, {5, -100, 2999, 0}});
  return s;
}

// The cases of cross_entropy (forward), cross_entropy_backward (backward: lse is an input) and
// cross_entropy_with_grad (fused: dloss in, lse and dlogits out) over the same specs.
enum class CeOp { forward, backward, fused };

Case ce_case(const CeSpec& s, CeOp op) {
  const bool backward = op == CeOp::backward;
  Case c;
  c.label = s.label;
  c.group = s.group;
  TensorInit logits = matrix(s.rows, s.vocab, backward ? Fill::normal : Fill::normal_outliers, 0, 1, s.pad);
  logits.scale = s.scale;
  c.args.push_back({"logits", logits});
  c.args.push_back({"target", ids(s.rows, s.vocab, s.targets)});
  if (op != CeOp::forward) c.args.push_back({"dloss", upstream(loss_shape(s.reduction, s.rows, s.vocab, false))});
  if (backward) {
    // lse of N(0, s^2) logits is about log V + s^2 / 2: p = exp(z - lse) stays a probability.
    TensorInit lse;
    lse.shape = Shape{s.rows};
    lse.fill = Fill::uniform;
    const double z = s.softcap > 0 ? std::min(s.scale, s.softcap) : s.scale;
    lse.low = std::log(double(s.vocab)) + 0.5 * z * z;
    lse.high = lse.low + 0.25;
    c.args.push_back({"lse", lse});
  }
  if (op != CeOp::forward && s.pad > 0) c.args.push_back({"dlogits", matrix(s.rows, s.vocab, Fill::zeros, 0, 1, 3)});
  c.args.push_back({"ignore_index", Value(s.ignore_index)});
  c.args.push_back({"label_smoothing", Value(s.label_smoothing)});
  c.args.push_back({"lse_square_scale", Value(s.lse_square_scale)});
  c.args.push_back({"softcap", Value(s.softcap)});
  c.args.push_back({"reduction", Value(s.reduction)});
  return c;
}

// ---- kl_div, jsd, tvd ---------------------------------------------------------------------------
struct PairSpec {
  std::string label;
  CaseGroup group;
  int64_t rows, vocab;
  std::string reduction = "batchmean";
  double option = 0;  // log_target (kl_div), beta (jsd)
  std::vector<double> labels;
  int64_t pad = 0;
  double low = -10;  // jsd: inputs uniform in [low, -1]
};

std::vector<PairSpec> shape_specs() {
  std::vector<PairSpec> s;
  s.push_back({"4x64", CaseGroup::small, 4, 64});
  s.push_back({"7x33", CaseGroup::small, 7, 33});
  s.push_back({"16x4096", CaseGroup::medium, 16, 4096});
  s.push_back({"16x32000", CaseGroup::medium, 16, 32000});
  for (auto [tokens, vocab] : {std::pair<int64_t, int64_t>{16, 32000}, {1024, 32000}, {16, 128256}, {256, 128256}})
    s.push_back({"t" + std::to_string(tokens) + "xv" + std::to_string(vocab), CaseGroup::large, tokens, vocab});
  s.push_back({"0x64", CaseGroup::edge, 0, 64});
  s.push_back({"1x1", CaseGroup::edge, 1, 1});
  s.push_back({"3x67", CaseGroup::edge, 3, 67});
  s.push_back({"5x4097", CaseGroup::edge, 5, 4097});
  s.push_back({"5x67_pad8", CaseGroup::edge, 5, 67, "batchmean", 0, {}, 8});
  // More rows than a GPU's SMs, each cut into segments by the many-row rule (Note [segment size]),
  // some rows ignored (jsd, tvd).
  s.push_back({"150x3000_labels", CaseGroup::edge, 150, 3000, "batchmean", 0, {3, -100, 7}});
  return s;
}

enum class PairOp { kl_div, jsd, tvd };

std::vector<PairSpec> pair_specs(PairOp op) {
  std::vector<PairSpec> s = shape_specs();
  if (op == PairOp::jsd) {
    for (PairSpec& p : s) p.option = 0.5;
    for (double beta : {0.0, 0.1, 1.0})
      s.push_back({"7x33_beta" + std::to_string(beta).substr(0, 3), CaseGroup::small, 7, 33, "", beta});
    s.push_back({"8x40_labels", CaseGroup::small, 8, 40, "", 0.5, {1, -100, 3, 4}});
    s.push_back({"4x40_all_ignored", CaseGroup::edge, 4, 40, "", 0.5, {-100}});
    // Log-probabilities far in the tail, where exp underflows f32 for both inputs (m = 0: the
    // element's m log m is 0, its limit, not 0 * -inf).
    s.push_back({"6x48_deep_tail", CaseGroup::edge, 6, 48, "", 0.3, {}, 0, -120});
    return s;
  }
  for (const char* r : {"none", "sum", "mean"})
    s.push_back({std::string("7x33_") + r, CaseGroup::small, 7, 33, r});
  if (op == PairOp::kl_div) {
    s.push_back({"7x33_log_target", CaseGroup::small, 7, 33, "batchmean", 1});
    s.push_back({"7x33_log_target_none", CaseGroup::small, 7, 33, "none", 1});
    s.push_back({"5x67_none_pad8", CaseGroup::edge, 5, 67, "none", 0, {}, 8});
  } else {
    s.push_back({"8x40_labels", CaseGroup::small, 8, 40, "batchmean", 0, {1, -100, 3, 4}});
    s.push_back({"8x40_labels_none", CaseGroup::small, 8, 40, "none", 0, {1, -100, 3, 4}});
    s.push_back({"8x40_labels_mean", CaseGroup::small, 8, 40, "mean", 0, {-100, 2}});
    s.push_back({"5x67_none_pad8", CaseGroup::edge, 5, 67, "none", 0, {}, 8});
    s.push_back({"4x40_all_ignored_sum", CaseGroup::edge, 4, 40, "sum", 0, {-100}});
  }
  return s;
}

Case pair_case(PairOp op, const PairSpec& s, bool backward) {
  Case c;
  c.label = s.label;
  c.group = s.group;
  const bool log_target = op == PairOp::kl_div && s.option != 0;
  // kl_div: y_pred log-probabilities, y_true probabilities of a long row (or log-probabilities);
  // jsd: both log-probabilities; tvd: probabilities in [0, 1).
  switch (op) {
    case PairOp::kl_div:
      if (!backward) c.args.push_back({"y_pred", matrix(s.rows, s.vocab, Fill::uniform, -12, -2, s.pad)});
      c.args.push_back({"y_true", log_target ? matrix(s.rows, s.vocab, Fill::uniform, -12, -2, s.pad)
                                             : matrix(s.rows, s.vocab, Fill::uniform, 0, 0.01, s.pad)});
      c.args.push_back({"log_target", Value(log_target)});
      c.args.push_back({"reduction", Value(s.reduction)});
      break;
    case PairOp::jsd:
      c.args.push_back({"input", matrix(s.rows, s.vocab, Fill::uniform, s.low, -1, s.pad)});
      c.args.push_back({"target", matrix(s.rows, s.vocab, Fill::uniform, s.low, -1, s.pad)});
      c.args.push_back({"beta", Value(s.option)});
      break;
    case PairOp::tvd:
      c.args.push_back({"p", matrix(s.rows, s.vocab, Fill::uniform, 0, 1, s.pad)});
      c.args.push_back({"q", matrix(s.rows, s.vocab, Fill::uniform, 0, 1, s.pad)});
      c.args.push_back({"reduction", Value(s.reduction)});
      break;
  }
  if (op != PairOp::kl_div && !s.labels.empty()) c.args.push_back({"labels", ids(s.rows, 1, s.labels)});
  if (backward) {
    const std::string r = op == PairOp::jsd ? "sum" : s.reduction;
    c.args.push_back({"dloss", upstream(loss_shape(r, s.rows, s.vocab, true))});
  }
  return c;
}

std::vector<Case> pair_cases(PairOp op, bool backward) {
  std::vector<Case> cases;
  for (const PairSpec& s : pair_specs(op)) cases.push_back(pair_case(op, s, backward));
  return cases;
}

}  // namespace

std::vector<Case> cross_entropy_cases() {
  std::vector<Case> cases;
  for (const CeSpec& s : ce_specs()) cases.push_back(ce_case(s, CeOp::forward));
  return cases;
}
std::vector<Case> cross_entropy_backward_cases() {
  std::vector<Case> cases;
  for (const CeSpec& s : ce_specs()) cases.push_back(ce_case(s, CeOp::backward));
  return cases;
}
std::vector<Case> cross_entropy_with_grad_cases() {
  std::vector<Case> cases;
  for (const CeSpec& s : ce_specs()) cases.push_back(ce_case(s, CeOp::fused));
  return cases;
}
std::vector<Case> kl_div_cases() { return pair_cases(PairOp::kl_div, false); }
std::vector<Case> kl_div_backward_cases() { return pair_cases(PairOp::kl_div, true); }
std::vector<Case> jsd_cases() { return pair_cases(PairOp::jsd, false); }
std::vector<Case> jsd_backward_cases() { return pair_cases(PairOp::jsd, true); }
std::vector<Case> tvd_cases() { return pair_cases(PairOp::tvd, false); }
std::vector<Case> tvd_backward_cases() { return pair_cases(PairOp::tvd, true); }

}  // namespace opforge
