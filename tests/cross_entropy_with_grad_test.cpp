// cross_entropy_with_grad (ops/loss): the fused op against cross_entropy then
// cross_entropy_backward (reference and cpu kernels, every reduction and option, padded rows),
// its argument checks (the error names the argument; a rejected call writes nothing), its
// registration (a forward op with no backward op; three CUDA impls in CUDA builds), and what of
// the CUDA kernels runs without a GPU: the cluster plan (Note [ce with grad clusters]) and the
// predicates' reasons. Correctness on the device is the harness's (`opforge check --backend cuda
// cross_entropy_with_grad`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/loss/internal.h"
#include "ops/loss/loss_cuda.h"
#include "test_util.h"

namespace opforge {
namespace {

using test_util::Buf;
using test_util::make;

const Context kCtx{};

void fill_random(const TensorView& t, uint32_t seed, double scale = 2.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> n(0.0, scale);
  for (int64_t row = 0; row < t.rows(); ++row)
    for (int64_t i = 0; i < t.size(-1); ++i) test_util::set(t, row, i, n(gen));
}

Tensor ids(const std::vector<double>& values) { return test_util::tensor(Shape{int64_t(values.size())}, DType::i64, values); }

struct Options {
  std::string reduction = "mean";
  double smoothing = 0, z_scale = 0, softcap = 0;
  int64_t ignore_index = -100;
};

// Fused outputs (loss, lse, dlogits) and the two separate ops' outputs for one call.
struct Outputs {
  Tensor loss, lse;
  Buf dlogits;
};

Outputs allocate(int64_t rows, int64_t vocab, DType dtype, const Options& o, int64_t pad) {
  const DType ld = loss_dtype(dtype);
  Outputs out;
  out.loss = Tensor::zeros(o.reduction == "none" ? Shape{rows} : Shape{1}, ld);
  out.lse = Tensor::zeros(Shape{rows}, ld);
  out.dlogits = make(Shape{rows, vocab}, dtype, pad);
  return out;
}

void expect_close(const TensorView& got, const TensorView& want, double rtol, double atol, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const int64_t cols = got.ndim > 1 ? got.size(-1) : 1, rows = got.ndim > 1 ? got.rows() : got.numel();
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < cols; ++i) {
      const double g = got.ndim > 1 ? test_util::get(got, row, i) : test_util::at(got, row);
      const double w = want.ndim > 1 ? test_util::get(want, row, i) : test_util::at(want, row);
      if (std::isnan(w)) {
        EXPECT_TRUE(std::isnan(g)) << what << "[" << row << ", " << i << "]";
        continue;
      }
      EXPECT_LE(std::fabs(g - w), atol + rtol * std::fabs(w)) << what << "[" << row << ", " << i << "] = " << g
                                                             << ", separate ops " << w;
    }
}

// The fused reference and cpu kernels against the separate reference ops, and the fused cpu
// kernel against the separate cpu kernels bit for bit (the same row code, the same f32 lse).
void compare(int64_t rows, int64_t vocab, DType dtype, const Options& o, const std::vector<double>& targets,
             int64_t pad = 0) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(rows) + "x" + std::to_string(vocab) + " " +
               o.reduction + " ls " + std::to_string(o.smoothing) + " z " + std::to_string(o.z_scale) + " cap " +
               std::to_string(o.softcap));
  Buf logits = make(Shape{rows, vocab}, dtype, pad);
  fill_random(logits, 17 + uint32_t(vocab));
  std::vector<double> t(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) t[size_t(i)] = targets.empty() ? double(i * 7919 % vocab) : targets[size_t(i) % targets.size()];
  const Tensor target = ids(t);
  const DType ld = loss_dtype(dtype);
  const Tensor dloss = o.reduction == "none" ? test_util::tensor(Shape{rows}, DType::bf16, std::vector<double>(size_t(rows), 0.75))
                                             : test_util::tensor(Shape{1}, ld, {1.5});
  auto fused = [&](auto kernel, Outputs& out) {
    kernel(kCtx, out.loss, out.lse, out.dlogits, logits, target, dloss, o.ignore_index, o.smoothing, o.z_scale,
           o.softcap, o.reduction);
  };
  auto separate = [&](auto fwd, auto bwd, Outputs& out) {
    fwd(kCtx, out.loss, out.lse, logits, target, o.ignore_index, o.smoothing, o.z_scale, o.softcap, o.reduction);
    bwd(kCtx, out.dlogits, dloss, logits, target, out.lse, o.ignore_index, o.smoothing, o.z_scale, o.softcap,
        o.reduction);
  };
  Outputs want = allocate(rows, vocab, dtype, o, pad), ref = allocate(rows, vocab, dtype, o, pad);
  separate(&cross_entropy_reference, &cross_entropy_backward_reference, want);
  fused(&cross_entropy_with_grad_reference, ref);
  EXPECT_EQ(test_util::bytes_of_tensor(ref.loss), test_util::bytes_of_tensor(want.loss));
  EXPECT_EQ(test_util::bytes_of_tensor(ref.lse), test_util::bytes_of_tensor(want.lse));
  EXPECT_EQ(test_util::bytes_of_tensor(ref.dlogits.storage), test_util::bytes_of_tensor(want.dlogits.storage));
  if (dtype == DType::f64) return;  // the cpu kernels leave f64 to the reference
  Outputs cpu = allocate(rows, vocab, dtype, o, pad), cpu_separate = allocate(rows, vocab, dtype, o, pad);
  fused(&cross_entropy_with_grad_cpu, cpu);
  separate(&cross_entropy_cpu, &cross_entropy_backward_cpu, cpu_separate);
  EXPECT_EQ(test_util::bytes_of_tensor(cpu.loss), test_util::bytes_of_tensor(cpu_separate.loss));
  EXPECT_EQ(test_util::bytes_of_tensor(cpu.lse), test_util::bytes_of_tensor(cpu_separate.lse));
  // Note [fused exps] (ops/loss/cpu.cpp): without smoothing and softcap the fused gradient takes p
  // from the statistics sweep's exps, and its last bits may differ from cross_entropy_backward's.
  if (o.smoothing > 0 || o.softcap > 0)
    EXPECT_EQ(test_util::bytes_of_tensor(cpu.dlogits.storage), test_util::bytes_of_tensor(cpu_separate.dlogits.storage));
  else
    expect_close(cpu.dlogits, cpu_separate.dlogits, test_util::rtol_of(dtype, 1e-6), 1e-9, "fused dlogits");
  test_util::expect_padding_untouched(cpu.dlogits);
  const double rtol = test_util::rtol_of(dtype, 1e-5);
  expect_close(cpu.loss, want.loss, 1e-5, 1e-6, "loss");
  expect_close(cpu.lse, want.lse, 1e-5, 1e-6, "lse");
  expect_close(cpu.dlogits, want.dlogits, rtol, 1e-7, "dlogits");
}

TEST(CrossEntropyWithGrad, MatchesForwardThenBackward) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    compare(6, 1000, dtype, {"mean"}, {});
    compare(5, 333, dtype, {"none", 0.1, 1e-3, 0}, {4, -100, 332, 0});
    compare(7, 2049, dtype, {"sum", 0.2, 1e-2, 12.0}, {-100, 5, 2048});
    compare(4, 64, dtype, {"mean", 0, 0, 8.0, 3}, {3, 1, 3, 63}, 5);  // ignore_index 3, padded rows
  }
}

// Every row ignored: mean of nothing is NaN and every gradient is 0; sum is 0.
TEST(CrossEntropyWithGrad, AllRowsIgnored) {
  for (const char* reduction : {"mean", "sum"}) {
    Outputs out = allocate(3, 40, DType::f32, {reduction}, 0);
    Buf logits = make(Shape{3, 40}, DType::f32);
    fill_random(logits, 3);
    const Tensor dloss = test_util::tensor(Shape{1}, DType::f32, {1});
    cross_entropy_with_grad_cpu(kCtx, out.loss, out.lse, out.dlogits, logits, ids({-100, -100, -100}), dloss, -100,
                                0, 0, 0, reduction);
    if (std::string(reduction) == "mean") {
      EXPECT_TRUE(std::isnan(test_util::at(out.loss, 0)));
    }
    else EXPECT_EQ(test_util::at(out.loss, 0), 0.0);
    for (int64_t i = 0; i < 3 * 40; ++i) EXPECT_EQ(test_util::at(out.dlogits.view, i), 0.0) << i;
    EXPECT_TRUE(std::isfinite(test_util::at(out.lse, 1)));  // lse is written for every row
  }
}

TEST(CrossEntropyWithGrad, RejectsBadArguments) {
  Tensor logits = test_util::tensor(Shape{3, 8}, DType::bf16, {0.5, -1, 2});
  Tensor loss = Tensor::zeros({1}, DType::f32), lse = Tensor::zeros({3}, DType::f32);
  Tensor dlogits = Tensor::zeros({3, 8}, DType::bf16), dloss = test_util::tensor(Shape{1}, DType::f16, {1});
  Tensor target = ids({1, -100, 7});
  auto check = [&](const TensorView& l, const TensorView& s, const TensorView& dx, const TensorView& x,
                   const TensorView& t, const TensorView& dl, double ls = 0, std::string_view r = "mean") {
    CrossEntropyWithGrad::check(l, s, dx, x, t, dl, -100, ls, 0, 0, r);
  };
  EXPECT_NO_THROW(check(loss, lse, dlogits, logits, target, dloss));
  EXPECT_NO_THROW(check(Tensor::zeros({3}, DType::f32), lse, dlogits, logits, target,
                        test_util::tensor(Shape{3}, DType::f64, {1, 2, 3}), 0.1, "none"));
  using test_util::expect_arg_error;
  expect_arg_error([&] { check(loss, lse, dlogits, logits, ids({1, 8, 7}), dloss); }, "target",
                   "cross_entropy_with_grad: argument 'target': expected ids in [0, 8) or ignore_index -100, got "
                   "target[1] = 8");
  expect_arg_error([&] { check(loss, lse, dlogits, logits, target, dloss, 0, "none"); }, "dloss", "shape [3]");
  expect_arg_error([&] { check(loss, lse, dlogits, logits, target, ids({1})); }, "dloss", "floating");
  expect_arg_error([&] { check(loss, lse, Tensor::zeros({3, 8}, DType::f32), logits, target, dloss); }, "dlogits",
                   "dtype bf16");
  expect_arg_error([&] { check(loss, lse, Tensor::zeros({3, 9}, DType::bf16), logits, target, dloss); }, "dlogits",
                   "shape [3, 8]");
  expect_arg_error([&] { check(loss, lse, logits, logits, target, dloss); }, "dlogits", "no overlap with 'logits'");
  TensorView dloss_in_dlogits(dlogits.data(), DType::bf16, Shape{1});
  expect_arg_error([&] { check(loss, lse, dlogits, logits, target, dloss_in_dlogits); }, "dlogits",
                   "no overlap with 'dloss'");
  expect_arg_error([&] { check(loss, lse, dlogits, logits, target, dloss, 1.5); }, "label_smoothing", "[0, 1]");
  expect_arg_error([&] { check(loss, lse, dlogits, logits, target, dloss, 0, "batchmean"); }, "reduction",
                   "one of none, sum, mean");
  expect_arg_error([&] { check(loss, Tensor::zeros({3}, DType::bf16), dlogits, logits, target, dloss); }, "lse",
                   "dtype f32");
  expect_arg_error([&] { check(Tensor::zeros({3}, DType::f32), lse, dlogits, logits, target, dloss); }, "loss",
                   "shape [1]");
}

// Through the registry's boxed call (every kernel): a rejected call writes none of the outputs.
TEST(CrossEntropyWithGrad, RejectedCallsLeaveOutputsUntouched) {
  Registry reg;
  register_loss(reg);
  Tensor logits = test_util::tensor(Shape{3, 8}, DType::f32, {0.5, -1, 2, 3});
  Tensor loss = test_util::tensor(Shape{1}, DType::f32, {7}), lse = test_util::tensor(Shape{3}, DType::f32, {1, 2, 3});
  Tensor dlogits = test_util::tensor(Shape{3, 8}, DType::f32, {9, 9, 9});
  Tensor dloss = test_util::tensor(Shape{1}, DType::f32, {1}), target = ids({1, 2, 3});
  const std::vector<const Tensor*> outs = {&loss, &lse, &dlogits};
  auto args = [&](const Tensor& t, double ls, const TensorView& dl, const TensorView& dx) {
    return std::vector<Value>{loss.view(), lse.view(), dx, logits.view(), t.view(), dl, int64_t(-100), ls, 0.0, 0.0,
                              std::string("mean")};
  };
  const Tensor bad_target = ids({1, 8, 2});
  test_util::expect_rejected(reg, "cross_entropy_with_grad", args(bad_target, 0, dloss, dlogits), "target", outs);
  test_util::expect_rejected(reg, "cross_entropy_with_grad", args(target, -0.5, dloss, dlogits), "label_smoothing",
                             outs);
  const Tensor dloss_rows = test_util::tensor(Shape{3}, DType::f32, {1, 1, 1});
  test_util::expect_rejected(reg, "cross_entropy_with_grad", args(target, 0, dloss_rows, dlogits), "dloss", outs);
  test_util::expect_rejected(reg, "cross_entropy_with_grad", args(target, 0, dloss, logits), "dlogits", outs);
}

// A forward op that also returns the gradient: no backward op of its own, so grad mode has
// nothing to difference; the test mode covers it. Its CUDA impls exist in CUDA builds.
TEST(CrossEntropyWithGrad, RegisteredWithoutBackward) {
  const OpEntry& op = global_registry().op("cross_entropy_with_grad");
  EXPECT_TRUE(op.backward.empty());
  EXPECT_NE(op.reference(), nullptr);
  std::vector<std::string> impls;
  for (const KernelEntry& k : op.kernels) impls.push_back(k.impl());
  EXPECT_NE(std::find(impls.begin(), impls.end(), "cpu"), impls.end());
  EXPECT_NE(std::find(impls.begin(), impls.end(), "cuda"), impls.end());  // or the placeholder
#ifdef OPFORGE_WITH_CUDA
  EXPECT_NE(std::find(impls.begin(), impls.end(), "cuda_cluster_vec16"), impls.end());
  EXPECT_NE(std::find(impls.begin(), impls.end(), "cuda_cluster"), impls.end());
#endif
}

// Note [ce with grad clusters] at an H100 / H200's numbers: 227 KB a CTA (opt-in), 228 KB an SM;
// the kernels pass both less a 2 KB margin, the target being a third of the SM.
TEST(CrossEntropyWithGrad, ClusterPlan) {
  const int64_t optin = 232448 - 2048, target = 233472 / 3 - 2048;
  // Llama-3's vocabulary in bf16 (256 KB a row): 4 CTAs of 62.6 KB, three of them an SM.
  CeGradClusterPlan p = ce_grad_cluster_plan(128256, 2, 8, 9, optin, target);
  EXPECT_EQ(p.cluster, 4);
  EXPECT_EQ(p.slice, 32064);
  EXPECT_EQ(p.smem_bytes, 64128);
  EXPECT_EQ(p.why, nullptr);
  EXPECT_EQ(ce_grad_cluster_plan(128256, 4, 4, 9, optin, target).cluster, 7);  // f32: 7 x 71.6 KB
  // Qwen's vocabulary in bf16 (297 KB a row): 5 CTAs of 59.4 KB (any count, not only powers of 2).
  p = ce_grad_cluster_plan(151936, 2, 8, 9, optin, target);
  EXPECT_EQ(p.cluster, 5);
  EXPECT_EQ(p.slice, 30392);
  // A quarter of the SM as the target: 5 CTAs of 50.1 KB for Llama-3's bf16 row.
  EXPECT_EQ(ce_grad_cluster_plan(128256, 2, 8, 9, optin, 233472 / 4 - 2048).cluster, 5);
  // A forced size is taken whenever its slice fits a CTA.
  EXPECT_EQ(ce_grad_cluster_plan(128256, 2, 8, 9, optin, target, 3).cluster, 3);
  EXPECT_EQ(ce_grad_cluster_plan(128256, 2, 8, 9, optin, target, 1).cluster, 4);  // 256 KB: does not fit
  EXPECT_EQ(ce_grad_cluster_plan(32000, 2, 8, 9, optin, target).cluster, 1);   // 62.5 KB: one CTA
  EXPECT_EQ(ce_grad_cluster_plan(1, 4, 1, 9, optin, target).cluster, 1);
  // Single elements: slices round up; the last CTA's is short.
  p = ce_grad_cluster_plan(128257, 2, 1, 9, optin, target);
  EXPECT_EQ(p.cluster, 4);
  EXPECT_EQ(p.slice, 32065);
  EXPECT_EQ(p.smem_bytes, 64144);
  // Past the target but within the opt-in limit: 8 CTAs of up to ~225 KB (V = 900k bf16).
  p = ce_grad_cluster_plan(900000, 2, 8, 9, optin, target);
  EXPECT_EQ(p.cluster, 8);
  EXPECT_LE(p.smem_bytes, optin);
  // Too long for any cluster, or no clusters: a reason, for the predicate.
  p = ce_grad_cluster_plan(1000000, 2, 8, 9, optin, target);
  EXPECT_EQ(p.cluster, 0);
  EXPECT_STREQ(p.why, "a row does not fit in the shared memory of a cluster of 8 CTAs");
  p = ce_grad_cluster_plan(128256, 2, 8, 8, optin, target);
  EXPECT_EQ(p.cluster, 0);
  EXPECT_STREQ(p.why, "compute capability below 9.0: no thread-block clusters");
  // The tuning override: any size whose slice fits the opt-in limit.
  EXPECT_EQ(ce_grad_cluster_plan(128256, 2, 8, 9, optin, target, 2).cluster, 2);
  EXPECT_EQ(ce_grad_cluster_plan(128256, 2, 8, 9, optin, target, 8).cluster, 8);
  EXPECT_EQ(ce_grad_cluster_plan(128256, 2, 8, 9, optin, target, 1).cluster, 4);  // 256 KB > opt-in
}

TEST(CrossEntropyWithGrad, FewRowRules) {
  // Clusters grow to fill 132 SMs up to 64 rows, at most 8 CTAs, never below the plan's size.
  EXPECT_EQ(ce_grad_few_row_cluster(16, 132, 1), 8);   // bf16 32,000: 16 CTAs -> 128
  EXPECT_EQ(ce_grad_few_row_cluster(16, 132, 4), 8);   // bf16 128,256
  EXPECT_EQ(ce_grad_few_row_cluster(1, 132, 1), 8);
  EXPECT_EQ(ce_grad_few_row_cluster(40, 132, 1), 3);
  EXPECT_EQ(ce_grad_few_row_cluster(40, 132, 4), 4);
  EXPECT_EQ(ce_grad_few_row_cluster(64, 132, 1), 2);
  EXPECT_EQ(ce_grad_few_row_cluster(65, 132, 1), 1);   // many rows: the plan's
  EXPECT_EQ(ce_grad_few_row_cluster(0, 132, 1), 1);
  EXPECT_EQ(ce_grad_few_row_cluster(16, 132, 0), 0);   // no plan stays no plan
  for (int64_t rows = 1; rows <= kCeGradFewRows; ++rows)
    for (int c = 1; c <= 8; ++c) {
      const int f = ce_grad_few_row_cluster(rows, 132, c);
      EXPECT_GE(f, c);
      EXPECT_LE(f, 8);
      EXPECT_TRUE(f == c || rows * f <= 132) << rows << " rows, plan " << c;
    }
  // Two kernels for few short rows without a softcap or label smoothing (z-loss allowed).
  EXPECT_TRUE(ce_grad_two_passes_faster(16, 32000, 0.0, 0.0));
  EXPECT_TRUE(ce_grad_two_passes_faster(64, 16384, 0.0, 0.0));
  EXPECT_FALSE(ce_grad_two_passes_faster(16, 128256, 0.0, 0.0));  // 2M logits: one read wins
  EXPECT_FALSE(ce_grad_two_passes_faster(16, 32000, 0.1, 0.0));
  EXPECT_FALSE(ce_grad_two_passes_faster(16, 32000, 0.0, 30.0));
  EXPECT_FALSE(ce_grad_two_passes_faster(65, 100, 0.0, 0.0));
  EXPECT_FALSE(ce_grad_two_passes_faster(0, 100, 0.0, 0.0));
}

#ifdef OPFORGE_WITH_CUDA
// The predicates' reasons that need no device: dtypes and 16-byte layouts are looked at before the
// device's properties (host memory views: the predicates only look at pointers and strides).
TEST(CrossEntropyWithGrad, CudaPredicatesNameLayoutProblems) {
  const Tensor buf = Tensor::zeros({4 * 4104}, DType::bf16), out = Tensor::zeros({4 * 4104}, DType::bf16);
  const Tensor loss = Tensor::zeros({1}, DType::f32), lse = Tensor::zeros({4}, DType::f32);
  const Tensor target = ids({0, 1, 2, 3}), dloss = Tensor::zeros({1}, DType::f32);
  auto view_of = [](const Tensor& t, int64_t cols, int64_t stride, int64_t offset) {
    const int64_t strides[2] = {stride, 1};
    return TensorView(static_cast<char*>(t.data()) + offset * 2, DType::bf16, Shape{4, cols}, strides, Device::cpu());
  };
  auto vec16 = [&](const TensorView& dx, const TensorView& x) {
    return cross_entropy_with_grad_cuda_cluster_vec16_applicable(loss, lse, dx, x, target, dloss, -100, 0, 0, 0,
                                                                 "mean");
  };
  EXPECT_STREQ(vec16(view_of(out, 4096, 4096, 0), view_of(buf, 4096, 4096, 1)), "a data pointer is not 16-byte aligned");
  EXPECT_STREQ(vec16(view_of(out, 4096, 4100, 0), view_of(buf, 4096, 4096, 0)), "row stride % 8 != 0");
  EXPECT_STREQ(vec16(view_of(out, 4097, 4097, 0), view_of(buf, 4097, 4097, 0)), "row length % 8 != 0");
  const Tensor f64 = Tensor::zeros({16}, DType::f64);
  const int64_t strides[2] = {4, 1};
  const TensorView x64(f64.data(), DType::f64, Shape{4, 4}, strides, Device::cpu());
  EXPECT_STREQ(cross_entropy_with_grad_cuda_cluster_applicable(loss, lse, x64, x64, target, dloss, -100, 0, 0, 0,
                                                               "mean"),
               "dtype is not f32, f16 or bf16");
}
#endif

}  // namespace
}  // namespace opforge
