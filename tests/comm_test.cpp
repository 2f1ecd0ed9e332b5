// The all_reduce op (ops/comm): argument checks with outputs untouched, the reference against
// hand-computed sums, and, where two GPUs and NCCL are present, the NCCL kernel against the
// reference. The NCCL all-reduce measurement (src/backends/comm.h): on a machine with fewer than
// two GPUs (or without CUDA or NCCL) it refuses with a reason instead of crashing; with two or more
// it checks the sum before timing and returns one point per (tp, bytes).
#include <gtest/gtest.h>

#include <string>

#include "backends/comm.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/comm/comm.h"
#include "tests/test_util.h"

namespace opforge {
namespace {

using test_util::expect_arg_error;
using test_util::expect_rejected;

Tensor values(const Shape& shape, DType dtype, const std::vector<double>& v) {
  Tensor t = Tensor::zeros(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) store_from_double(t.data(), dtype, int64_t(i), v[i]);
  return t;
}

TEST(AllReduceChecks, RejectsBadArguments) {
  Tensor x = Tensor::zeros({2, 3}, DType::bf16), y = Tensor::zeros({2, 3}, DType::bf16);
  expect_arg_error([&] { AllReduce::check(y, Tensor::zeros({0, 3}, DType::bf16)); }, "x", "at least one rank");
  expect_arg_error([&] { AllReduce::check(y, Tensor::zeros({2, 3}, DType::i32)); }, "x", "floating");
  expect_arg_error([&] { AllReduce::check(Tensor::zeros({2, 4}, DType::bf16), x); }, "y", "[2, 3]");
  expect_arg_error([&] { AllReduce::check(Tensor::zeros({2, 3}, DType::f32), x); }, "y", "dtype bf16");
  expect_arg_error([&] { AllReduce::check(x, x); }, "y", "overlap");
  Tensor wide = Tensor::zeros({2, 4}, DType::bf16);
  const int64_t strides[] = {4, 1};
  TensorView strided(wide.data(), DType::bf16, Shape{2, 3}, strides);
  expect_arg_error([&] { AllReduce::check(y, strided); }, "x", "contiguous");
  expect_arg_error([&] { AllReduce::check(strided, x); }, "y", "contiguous");
}

TEST(AllReduceChecks, RejectedCallsLeaveOutputsUntouched) {
  Registry reg;
  register_comm(reg);
  Tensor y = values({2, 3}, DType::f32, {9, 9, 9, 9, 9, 9});
  expect_rejected(reg, "all_reduce", {y.view(), Tensor::zeros({3, 3}, DType::f32).view()}, "y", {&y});
  expect_rejected(reg, "all_reduce", {y.view(), Tensor::zeros({2, 3}, DType::f16).view()}, "y", {&y});
}

TEST(AllReduceReference, EveryRankGetsTheSum) {
  const Context ctx{};
  Tensor x = values({3, 2, 2}, DType::f32, {1, 2, 3, 4, 10, 20, 30, 40, 100, 200, 300, 400});
  Tensor y = Tensor::zeros({3, 2, 2}, DType::f32);
  all_reduce_reference(ctx, y.view(), x.view());
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_EQ(load_as_double(y.data(), DType::f32, r * 4 + i), 111.0 * double(i + 1)) << r << ", " << i;
  // bf16: the sum is rounded once (1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly, where a pairwise bf16 sum
  // would round 1 + 2^-8 to 1 first).
  Tensor xb = values({3, 1}, DType::bf16, {1.0, 1.0 / 256, 1.0 / 256});
  Tensor yb = Tensor::zeros({3, 1}, DType::bf16);
  all_reduce_reference(ctx, yb.view(), xb.view());
  EXPECT_EQ(load_as_double(yb.data(), DType::bf16, 0), 1.0 + 1.0 / 128);
}

TEST(Comm, AllReduceNeedsTwoGpusAndSaysWhy) {
  AllReduceSetup setup;
  setup.tps = {2};
  setup.bytes = {4096};
  setup.samples = 2;
  setup.calls = 2;
  if (comm_device_count() >= 2 && nccl_describe().rfind("NCCL ", 0) == 0) {
    const auto points = measure_nccl_all_reduce(setup);
    ASSERT_EQ(points.size(), 1u);
    EXPECT_EQ(points[0].tp, 2);
    EXPECT_GT(points[0].median_us, 0);
    return;
  }
  try {
    measure_nccl_all_reduce(setup);
    ADD_FAILURE() << "expected not_available";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_available) << e.what();
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
  }
}

TEST(Comm, DescribesNcclOrWhyNot) { EXPECT_FALSE(nccl_describe().empty()); }

}  // namespace
}  // namespace opforge
