// The softmax and loss families (ops/softmax, ops/loss): argument checks of every op (the error
// names the argument; a rejected call writes nothing), reference kernels against hand-computed
// values, cpu kernels against the reference where the harness does not look (masked -inf
// prefixes, many threads vs one), and registration.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/convert.h"
#include "backends/cpu/cpu_info.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/loss/internal.h"
#include "ops/softmax/internal.h"

namespace opforge {
namespace {

const Context kCtx{};

Tensor filled(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t = Tensor::zeros(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i)
    store_from_double(t.data(), dtype, i, values.empty() ? 0.0 : values[size_t(i) % values.size()]);
  return t;
}

Tensor random(const Shape& shape, DType dtype, uint32_t seed, double low = -3, double high = 3) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(low, high);
  std::vector<double> v(size_t(shape.numel()));
  for (double& e : v) e = u(gen);
  return filled(shape, dtype, v);
}

Tensor ids(const std::vector<double>& values) {
  return filled(Shape{int64_t(values.size())}, DType::i64, values);
}

double value(const TensorView& t, int64_t i) { return load_as_double(t.data, t.dtype, i); }

void expect_values(const TensorView& t, const std::vector<double>& expected, double tol) {
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(value(t, int64_t(i)), expected[i], tol) << "element " << i;
}

// f throws an opforge::Error naming `arg` (and containing `fragment`).
void expect_arg_error(const std::function<void()>& f, const std::string& arg,
                      const std::string& fragment = "") {
  try {
    f();
    ADD_FAILURE() << "no error for argument '" << arg << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("argument '" + arg + "'"), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
  }
}

// ---- checks ------------------------------------------------------------------------------------
TEST(SoftmaxChecks, RejectBadArguments) {
  Tensor x = random({4, 10}, DType::f32, 1), y = Tensor::zeros({4, 10}, DType::f32);
  EXPECT_NO_THROW(Softmax::check(y, x));
  EXPECT_NO_THROW(LogSoftmax::check(x, x));  // in place
  expect_arg_error([&] { Softmax::check(Tensor::zeros({4, 9}, DType::f32), x); }, "y", "shape [4, 10]");
  expect_arg_error([&] { LogSoftmax::check(Tensor::zeros({4, 10}, DType::bf16), x); }, "y", "dtype f32");
  expect_arg_error([&] { Sparsemax::check(y, Tensor::zeros({4, 10}, DType::i64)); }, "x", "floating");
  expect_arg_error([&] { Sparsemax::check(y, TensorView{}); }, "x", "none");
  TensorView shifted(static_cast<float*>(x.data()) + 1, DType::f32, Shape{3, 10});
  TensorView base(x.data(), DType::f32, Shape{3, 10});
  expect_arg_error([&] { Softmax::check(shifted, base); }, "y", "no overlap with 'x'");
  Tensor dy = random({4, 10}, DType::f32, 2), dx = Tensor::zeros({4, 10}, DType::f32);
  EXPECT_NO_THROW(SoftmaxBackward::check(dx, dy, y));
  EXPECT_NO_THROW(SparsemaxBackward::check(dy, dy, y));  // dx over dy
  expect_arg_error([&] { SoftmaxBackward::check(y, dy, y); }, "dx", "no overlap with 'y'");
  expect_arg_error([&] { LogSoftmaxBackward::check(dx, random({4, 11}, DType::f32, 3), y); }, "dy", "shape [4, 10]");
  expect_arg_error([&] { SparsemaxBackward::check(dx, dy, Tensor::zeros({4, 10}, DType::f16)); }, "dy", "dtype f16");
}

struct CeArgs {
  Tensor loss = Tensor::zeros({1}, DType::f32), lse = Tensor::zeros({3}, DType::f32);
  Tensor logits = random({3, 8}, DType::bf16, 4);
  Tensor target = ids({1, -100, 7});
};

TEST(LossChecks, CrossEntropyRejectsBadArguments) {
  CeArgs a;
  auto check = [&](const TensorView& loss, const TensorView& lse, const TensorView& logits,
                   const TensorView& target, int64_t ignore = -100, double ls = 0, double z = 0,
                   double cap = 0, std::string_view reduction = "mean") {
    CrossEntropy::check(loss, lse, logits, target, ignore, ls, z, cap, reduction);
  };
  EXPECT_NO_THROW(check(a.loss, a.lse, a.logits, a.target));
  EXPECT_NO_THROW(check(Tensor::zeros({3}, DType::f32), a.lse, a.logits, a.target, -100, 0.1, 1e-4, 30, "none"));
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, ids({1, 8, 7})); }, "target",
                   "cross_entropy: argument 'target': expected ids in [0, 8) or ignore_index -100, got target[1] = 8");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, ids({1, -1, 7})); }, "target", "target[1] = -1");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, ids({1, -100, 7}), 0); }, "target", "target[1] = -100");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, ids({1, 2})); }, "target", "shape [3]");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, filled({3}, DType::i32, {1})); }, "target", "dtype i64");
  expect_arg_error([&] { check(a.loss, a.lse, random({2, 3, 8}, DType::bf16, 5), a.target); }, "logits", "2 dims");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, a.target, -100, 0, 0, 0, "avg"); }, "reduction", "one of none, sum, mean");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, a.target, -100, 1.5); }, "label_smoothing", "[0, 1]");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, a.target, -100, 0, -1); }, "lse_square_scale");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, a.target, -100, 0, 0, -30); }, "softcap");
  expect_arg_error([&] { check(a.loss, a.lse, a.logits, a.target, -100, 0, 0, NAN); }, "softcap");
  expect_arg_error([&] { check(Tensor::zeros({3}, DType::f32), a.lse, a.logits, a.target); }, "loss", "shape [1]");
  expect_arg_error([&] { check(Tensor::zeros({1}, DType::bf16), a.lse, a.logits, a.target); }, "loss", "dtype f32");
  expect_arg_error([&] { check(a.loss, Tensor::zeros({3}, DType::bf16), a.logits, a.target); }, "lse", "dtype f32");
  Tensor dlogits = Tensor::zeros({3, 8}, DType::bf16), dloss = random({1}, DType::f32, 6);
  auto check_bwd = [&](const TensorView& dx, const TensorView& dl, const TensorView& target,
                       std::string_view reduction = "mean") {
    CrossEntropyBackward::check(dx, dl, a.logits, target, a.lse, -100, 0, 0, 0, reduction);
  };
  EXPECT_NO_THROW(check_bwd(dlogits, dloss, a.target));
  expect_arg_error([&] { check_bwd(dlogits, dloss, ids({1, 9, 7})); }, "target", "target[1] = 9");
  expect_arg_error([&] { check_bwd(dlogits, dloss, a.target, "none"); }, "dloss", "shape [3]");
  expect_arg_error([&] { check_bwd(a.logits, dloss, a.target); }, "dlogits", "no overlap with 'logits'");
  expect_arg_error([&] { check_bwd(Tensor::zeros({3, 8}, DType::f32), dloss, a.target); }, "dlogits", "dtype bf16");
}

TEST(LossChecks, DivergencesRejectBadArguments) {
  Tensor a = random({4, 6}, DType::f32, 7), b = random({4, 6}, DType::f32, 8, 0, 1);
  Tensor scalar = Tensor::zeros({1}, DType::f32), elems = Tensor::zeros({4, 6}, DType::f32);
  EXPECT_NO_THROW(KlDiv::check(scalar, a, b, false, "batchmean", 1e-10));
  EXPECT_NO_THROW(KlDiv::check(elems, a, b, true, "none", 1e-10));
  expect_arg_error([&] { KlDiv::check(scalar, a, b, false, "batch", 1e-10); }, "reduction", "batchmean");
  expect_arg_error([&] { KlDiv::check(scalar, a, b, false, "sum", -1); }, "eps");
  expect_arg_error([&] { KlDiv::check(scalar, a, random({4, 5}, DType::f32, 9), false, "sum", 0); }, "y_true", "shape [4, 6]");
  expect_arg_error([&] { KlDiv::check(scalar, a, b, false, "none", 0); }, "loss", "shape [4, 6]");
  expect_arg_error([&] { KlDivBackward::check(elems, scalar, b, false, "none", 0); }, "dloss", "shape [4, 6]");
  expect_arg_error([&] { KlDivBackward::check(b, scalar, b, false, "sum", 0); }, "dy_pred", "no overlap with 'y_true'");
  Tensor labels = ids({0, -100, 2, 3});
  EXPECT_NO_THROW(Jsd::check(scalar, a, b, labels, 0.5, -100));
  EXPECT_NO_THROW(Jsd::check(scalar, a, b, TensorView{}, 0.0, -100));
  expect_arg_error([&] { Jsd::check(scalar, a, b, labels, 1.5, -100); }, "beta", "[0, 1]");
  expect_arg_error([&] { Jsd::check(scalar, a, b, ids({0, 1}), 0.5, -100); }, "labels", "shape [4]");
  expect_arg_error([&] { Jsd::check(scalar, a, Tensor::zeros({4, 6}, DType::bf16), labels, 0.5, -100); }, "target", "dtype f32");
  expect_arg_error([&] { JsdBackward::check(elems, elems, a, b, labels, 0.5, -100); }, "dloss", "shape [1]");
  EXPECT_NO_THROW(Tvd::check(elems, a, b, labels, "none", -100));
  expect_arg_error([&] { Tvd::check(scalar, a, b, labels, "max", -100); }, "reduction");
  expect_arg_error([&] { Tvd::check(scalar, a, b, filled({4}, DType::f32, {0}), "sum", -100); }, "labels", "dtype i64");
  expect_arg_error([&] { TvdBackward::check(elems, scalar, a, b, labels, "none", -100); }, "dloss", "shape [4, 6]");
  expect_arg_error([&] { TvdBackward::check(Tensor::zeros({4, 6}, DType::f16), scalar, a, b, labels, "sum", -100); }, "dp", "dtype f32");
}

// Through the registry's boxed call (all kernels): a rejected call writes nothing.
TEST(LossChecks, RejectedCallsLeaveOutputsUntouched) {
  Registry reg;
  register_softmax(reg);
  register_loss(reg);
  CeArgs a;
  Tensor logits = random({3, 8}, DType::f32, 10);
  Tensor y = random({3, 8}, DType::f32, 11);
  Tensor bad_target = ids({1, 8, 7});  // 8 is out of range for vocab 8
  Tensor wrong_width = random({3, 9}, DType::f32, 12);
  const std::vector<std::pair<std::string, std::vector<Value>>> calls = {
      {"cross_entropy", {a.loss.view(), a.lse.view(), logits.view(), bad_target.view(), int64_t(-100), 0.0, 0.0, 0.0, std::string("mean")}},
      {"cross_entropy", {a.loss.view(), a.lse.view(), logits.view(), a.target.view(), int64_t(-100), 2.0, 0.0, 0.0, std::string("mean")}},
      {"softmax", {y.view(), wrong_width.view()}},
      {"kl_div", {a.loss.view(), logits.view(), logits.view(), false, std::string("mean"), -1.0}},
  };
  for (const auto& [op, args] : calls) {
    SCOPED_TRACE(op);
    const std::vector<Tensor*> outs = {&a.loss, &a.lse, &y};
    std::vector<std::vector<unsigned char>> before;
    for (const Tensor* t : outs)
      before.emplace_back(static_cast<unsigned char*>(t->data()), static_cast<unsigned char*>(t->data()) + t->nbytes());
    EXPECT_THROW(reg.call(op, args), Error);
    for (size_t k = 0; k < outs.size(); ++k)
      EXPECT_EQ(std::memcmp(before[k].data(), outs[k]->data(), size_t(outs[k]->nbytes())), 0);
  }
}

// ---- reference kernels: hand-computed values ----------------------------------------------------
TEST(SoftmaxReference, HandValues) {
  Tensor x = filled({1, 3}, DType::f64, {1, 2, 3}), y = Tensor::zeros({1, 3}, DType::f64);
  softmax_reference(kCtx, y, x);  // e^k / (e + e^2 + e^3)
  expect_values(y, {0.0900305731703805, 0.244728471054798, 0.665240955774822}, 1e-14);
  log_softmax_reference(kCtx, y, x);  // k - 3.40760596444438
  expect_values(y, {-2.40760596444438, -1.40760596444438, -0.40760596444438}, 1e-13);
  // sparsemax([0.5, 0.2, -1]): support {0, 1}, tau = (0.7 - 1) / 2 = -0.15.
  Tensor s = filled({1, 3}, DType::f64, {0.5, 0.2, -1});
  sparsemax_reference(kCtx, y, s);
  expect_values(y, {0.65, 0.35, 0}, 1e-15);
  Tensor dy = filled({1, 3}, DType::f64, {1, 3, 5}), dx = Tensor::zeros({1, 3}, DType::f64);
  sparsemax_backward_reference(kCtx, dx, dy, y);  // mean over the support = 2
  expect_values(dx, {-1, 1, 0}, 1e-15);
}

TEST(LossReference, CrossEntropyHandValues) {
  // logits [1, 2, 3]: lse = 3.40760596444438; target 2: loss = lse - 3.
  Tensor logits = filled({2, 3}, DType::f64, {1, 2, 3, 0, 0, 0});
  Tensor lse = Tensor::zeros({2}, DType::f64), loss = Tensor::zeros({2}, DType::f64);
  cross_entropy_reference(kCtx, loss, lse, logits, ids({2, -100}), -100, 0, 0, 0, "none");
  expect_values(lse, {3.40760596444438, std::log(3.0)}, 1e-13);
  expect_values(loss, {0.40760596444438, 0}, 1e-13);
  Tensor mean = Tensor::zeros({1}, DType::f64);
  cross_entropy_reference(kCtx, mean, lse, logits, ids({2, 0}), -100, 0, 0, 0, "mean");
  expect_values(mean, {(0.40760596444438 + std::log(3.0)) / 2}, 1e-13);
  // Label smoothing 0.3, z-loss 0.01 on row 0: 0.7 (lse - 3) + 0.3 lse - 0.1 * 6 + 0.01 lse^2.
  const double l = 3.40760596444438;
  cross_entropy_reference(kCtx, loss, lse, logits, ids({2, 1}), -100, 0.3, 0.01, 0, "none");
  expect_values(loss, {0.7 * (l - 3) + 0.3 * l - 0.6 + 0.01 * l * l}, 1e-12);
  // All rows ignored: mean is 0 / 0 (NaN, as in PyTorch), sum is 0.
  cross_entropy_reference(kCtx, mean, lse, logits, ids({-100, -100}), -100, 0, 0, 0, "mean");
  EXPECT_TRUE(std::isnan(value(mean, 0)));
  cross_entropy_reference(kCtx, mean, lse, logits, ids({-100, -100}), -100, 0, 0, 0, "sum");
  expect_values(mean, {0}, 0);
}

TEST(LossReference, DivergenceHandValues) {
  // kl_div: y_true [0.5, 0.5], y_pred = log [0.25, 0.75]: 0.5 ln 2 + 0.5 ln(2/3), batchmean / 1.
  Tensor pred = filled({1, 2}, DType::f64, {std::log(0.25), std::log(0.75)});
  Tensor truth = filled({1, 2}, DType::f64, {0.5, 0.5}), loss = Tensor::zeros({1}, DType::f64);
  kl_div_reference(kCtx, loss, pred, truth, false, "batchmean", 1e-10);
  expect_values(loss, {0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)}, 1e-14);
  kl_div_reference(kCtx, loss, pred, truth, false, "mean", 1e-10);
  expect_values(loss, {(0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)) / 2}, 1e-14);
  // tvd: 0.5 (|0.2 - 0.5| + |0.8 - 0.5|) = 0.3 per row; the ignored row counts for nothing.
  Tensor p = filled({2, 2}, DType::f64, {0.2, 0.8}), q = filled({2, 2}, DType::f64, {0.5, 0.5});
  tvd_reference(kCtx, loss, p, q, ids({0, -100}), "batchmean", -100);
  expect_values(loss, {0.3}, 1e-15);
  // jsd with beta 0.5 of identical distributions is 0; beta 0 is KL(P || Q).
  Tensor lq = filled({1, 2}, DType::f64, {std::log(0.25), std::log(0.75)});
  Tensor lp = filled({1, 2}, DType::f64, {std::log(0.5), std::log(0.5)});
  jsd_reference(kCtx, loss, lq, lq, TensorView{}, 0.5, -100);
  expect_values(loss, {0}, 1e-15);
  jsd_reference(kCtx, loss, lq, lp, TensorView{}, 0.0, -100);
  expect_values(loss, {0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0)}, 1e-14);
}

// ---- cpu kernels ---------------------------------------------------------------------------------
// Rows whose first blocks are all -inf (masked vocabulary) give the reference's values, not NaN.
void masked_prefix_matches_reference() {
  const int64_t n = 9000;
  Tensor x = random({2, n}, DType::f32, 13);
  for (int64_t i = 0; i < 6000; ++i) store_from_double(x.data(), DType::f32, i, -INFINITY);
  for (auto kernel : {std::pair{&softmax_cpu, &softmax_reference}, {&log_softmax_cpu, &log_softmax_reference}}) {
    Tensor got = Tensor::zeros({2, n}, DType::f32), want = Tensor::zeros({2, n}, DType::f32);
    kernel.first(kCtx, got, x);
    kernel.second(kCtx, want, x);
    for (int64_t i = 0; i < 2 * n; ++i) {
      const double g = value(got, i), w = value(want, i);
      if (std::isinf(w)) {
        EXPECT_EQ(g, w) << i;
      }
      else EXPECT_NEAR(g, w, 1e-5 * (1 + std::fabs(w))) << i;
    }
  }
  Tensor logits = x, lse = Tensor::zeros({2}, DType::f32), loss = Tensor::zeros({2}, DType::f32);
  Tensor lse_ref = Tensor::zeros({2}, DType::f32), loss_ref = Tensor::zeros({2}, DType::f32);
  cross_entropy_cpu(kCtx, loss, lse, logits, ids({7000, 100}), -100, 0, 0, 0, "none");
  cross_entropy_reference(kCtx, loss_ref, lse_ref, logits, ids({7000, 100}), -100, 0, 0, 0, "none");
  EXPECT_NEAR(value(lse, 0), value(lse_ref, 0), 1e-5);
  EXPECT_NEAR(value(loss, 0), value(loss_ref, 0), 1e-5);
  EXPECT_NEAR(value(loss, 1), value(loss_ref, 1), 1e-5);
  cross_entropy_cpu(kCtx, loss, lse, logits, ids({100, 100}), -100, 0, 0, 0, "none");
  EXPECT_TRUE(std::isinf(value(loss, 0)));  // the target is masked: an infinite loss
  // The fused gradient (Note [fused exps] in ops/loss/cpu.cpp) over the masked blocks: p = 0.
  Tensor dlogits = Tensor::zeros({2, n}, DType::f32), dlogits_ref = Tensor::zeros({2, n}, DType::f32);
  Tensor one = filled({1}, DType::f32, {1.0});
  cross_entropy_with_grad_cpu(kCtx, loss, lse, dlogits, logits, ids({7000, 100}), one, -100, 0, 0, 0, "sum");
  cross_entropy_with_grad_reference(kCtx, loss_ref, lse_ref, dlogits_ref, logits, ids({7000, 100}), one, -100, 0, 0, 0,
                                    "sum");
  for (int64_t i = 0; i < n; ++i)  // row 0 (row 1's target is masked: an infinite loss)
    EXPECT_NEAR(value(dlogits, i), value(dlogits_ref, i), 1e-6 + 1e-5 * std::fabs(value(dlogits_ref, i))) << i;
  EXPECT_NEAR(value(lse, 0), value(lse_ref, 0), 1e-5);
}

// Values from the row's max down past exp's normal range (x - max in [-110, 0], exact 0 and -inf
// among them): every probability to 1e-5 relative (an absolute 1e-37 below the normal range,
// where the kernels' exp flushes to 0), log-probabilities and lse to 1e-5.
void exp_range_matches_reference() {
  const int64_t n = 4001;
  std::vector<double> row(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) row[size_t(i)] = -110.0 * double(i) / double(n - 1) + 3.0;
  row[17] = 3.0, row[400] = -INFINITY, row[3000] = 3.0 - 87.5, row[3001] = 3.0 - 88.0;
  Tensor x = filled({1, n}, DType::f32, row);
  Tensor got = Tensor::zeros({1, n}, DType::f32), want = Tensor::zeros({1, n}, DType::f32);
  softmax_cpu(kCtx, got, x);
  softmax_reference(kCtx, want, x);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(value(got, i), value(want, i), 1e-5 * value(want, i) + 1e-37) << "softmax element " << i;
  log_softmax_cpu(kCtx, got, x);
  log_softmax_reference(kCtx, want, x);
  for (int64_t i = 0; i < n; ++i) {
    if (std::isinf(value(want, i))) EXPECT_EQ(value(got, i), value(want, i)) << i;
    else EXPECT_NEAR(value(got, i), value(want, i), 1e-5 * (1 + std::fabs(value(want, i)))) << "log_softmax " << i;
  }
  Tensor lse = Tensor::zeros({1}, DType::f32), loss = Tensor::zeros({1}, DType::f32);
  Tensor lse_ref = Tensor::zeros({1}, DType::f32), loss_ref = Tensor::zeros({1}, DType::f32);
  cross_entropy_cpu(kCtx, loss, lse, x, ids({2000}), -100, 0, 0, 0, "none");
  cross_entropy_reference(kCtx, loss_ref, lse_ref, x, ids({2000}), -100, 0, 0, 0, "none");
  EXPECT_NEAR(value(lse, 0), value(lse_ref, 0), 1e-5);
  EXPECT_NEAR(value(loss, 0), value(loss_ref, 0), 1e-5 * (1 + std::fabs(value(loss_ref, 0))));
}

// kl_div's and jsd's logs over the f32 range (the log takes hn::Log's path for a vector with a
// lane outside the normal range): y_true from 0 and subnormals up to 1e30, with a subnormal and
// a normal eps; jsd's log-probabilities down to -130, where exp(x) leaves f32's range.
void divergence_logs_match_reference() {
  const int64_t n = 3001;
  std::vector<double> y_true(static_cast<size_t>(n)), y_pred(static_cast<size_t>(n));
  std::vector<double> log_q(static_cast<size_t>(n)), log_p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double f = double(i) / double(n - 1);
    y_true[size_t(i)] = std::pow(10.0, -44.0 + 74.0 * f);
    y_pred[size_t(i)] = std::sin(double(i));
    log_q[size_t(i)] = -130.0 * f;
    log_p[size_t(i)] = -130.0 * (1.0 - f) * std::fabs(std::cos(double(i)));
  }
  y_true[5] = 0.0, y_true[6] = 1e-45, y_true[2000] = 1.0;
  log_q[100] = log_p[100] = -125.0;  // both probabilities below f32's normal range
  Tensor yt = filled({1, n}, DType::f32, y_true), yp = filled({1, n}, DType::f32, y_pred);
  for (double eps : {1e-40, 1e-10}) {
    SCOPED_TRACE(eps);
    Tensor got = Tensor::zeros({1, n}, DType::f32), want = Tensor::zeros({1, n}, DType::f32);
    kl_div_cpu(kCtx, got, yp, yt, false, "none", eps);
    kl_div_reference(kCtx, want, yp, yt, false, "none", eps);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(value(got, i), value(want, i), 1e-5 * std::fabs(value(want, i)) + 1e-37) << "kl_div element " << i;
  }
  Tensor q = filled({1, n}, DType::f32, log_q), p = filled({1, n}, DType::f32, log_p);
  for (double beta : {0.5, 0.1}) {
    SCOPED_TRACE(beta);
    Tensor got = Tensor::zeros({}, DType::f32), want = Tensor::zeros({}, DType::f32);
    jsd_cpu(kCtx, got, q, p, TensorView{}, beta, -100);
    jsd_reference(kCtx, want, q, p, TensorView{}, beta, -100);
    EXPECT_NEAR(value(got, 0), value(want, 0), 1e-5 * std::fabs(value(want, 0)));
  }
}

// The kernels on every SIMD target this machine runs (the dispatch is restricted in turn): the
// exp and the log take other paths on AVX-512 than on the narrower targets.
TEST(SoftmaxCpu, MatchesReferenceOnEveryTarget) {
  for (const cpu::SimdTarget& target : cpu::simd_targets()) {
    SCOPED_TRACE(target.name);
    cpu::restrict_simd_target_for_testing(target.bit);
    masked_prefix_matches_reference();
    exp_range_matches_reference();
    divergence_logs_match_reference();
  }
  cpu::restrict_simd_target_for_testing(0);
}

// Reductions are in row order: the same bits with one thread and with all of them.
TEST(LossCpu, ReducedLossIndependentOfThreads) {
  Tensor logits = random({64, 3000}, DType::bf16, 14);
  std::vector<double> t(64);
  for (size_t i = 0; i < t.size(); ++i) t[i] = i % 5 == 0 ? -100 : double(i * 37 % 3000);
  Tensor target = ids(t), lse = Tensor::zeros({64}, DType::f32);
  Tensor a = Tensor::zeros({1}, DType::f32), b = Tensor::zeros({1}, DType::f32);
  Tensor p = random({64, 3000}, DType::bf16, 15, 0, 1), q = random({64, 3000}, DType::bf16, 16, 0, 1);
  Tensor ta = Tensor::zeros({1}, DType::f32), tb = Tensor::zeros({1}, DType::f32);
  const int saved = cpu::set_thread_count_for_testing(1);
  cross_entropy_cpu(kCtx, a, lse, logits, target, -100, 0.1, 1e-4, 0, "mean");
  tvd_cpu(kCtx, ta, p, q, target, "batchmean", -100);
  cpu::set_thread_count_for_testing(std::max(saved, 4));
  cross_entropy_cpu(kCtx, b, lse, logits, target, -100, 0.1, 1e-4, 0, "mean");
  tvd_cpu(kCtx, tb, p, q, target, "batchmean", -100);
  cpu::set_thread_count_for_testing(saved);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 4), 0);
  EXPECT_EQ(std::memcmp(ta.data(), tb.data(), 4), 0);
}

TEST(SoftmaxLossRegistration, EveryOpHasReferenceAndCpuKernels) {
  Registry reg;
  register_softmax(reg);
  register_loss(reg);
  for (const char* name : {"softmax", "softmax_backward", "log_softmax", "log_softmax_backward",
                           "sparsemax", "sparsemax_backward", "cross_entropy",
                           "cross_entropy_backward", "kl_div", "kl_div_backward", "jsd",
                           "jsd_backward", "tvd", "tvd_backward"}) {
    SCOPED_TRACE(name);
    const OpEntry& op = reg.op(name);
    EXPECT_NE(op.reference(), nullptr);
    EXPECT_TRUE(op.cases != nullptr);
    bool has_cpu = false;
    for (const auto& k : op.kernels) has_cpu |= k.impl() == "cpu";
    EXPECT_TRUE(has_cpu);
  }
}

}  // namespace
}  // namespace opforge
