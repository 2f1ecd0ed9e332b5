// moe_permute and moe_unpermute (ops/routing/moe.cpp): argument checks (the error names the
// argument and no output is written), the stable expert order of Note [moe permutation] on known
// ids, i64 inv_perm, and permute followed by unpermute giving back the weighted sum of the rows.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/routing/internal.h"
#include "tests/test_util.h"

namespace opforge {
namespace {

Registry& routing() {
  static Registry reg;
  static bool done = [] {
    register_routing(reg);
    return true;
  }();
  (void)done;
  return reg;
}

using test_util::tensor;
using test_util::values_of;

// The call throws invalid_argument naming `arg` and leaves every tensor in `watched` unchanged.
void expect_rejected(const std::string& op, const std::vector<Value>& args, const std::string& arg,
                     const std::vector<const Tensor*>& watched) {
  test_util::expect_rejected(routing(), op, args, arg, watched);
}

void run_impl(const std::string& op, const std::vector<Value>& args, const std::string& impl) {
  routing().call(op, args, Policy::parse(op + "=" + impl));
}

TEST(MoeChecks, PermuteRejectsBadArguments) {
  // 3 tokens, k = 2, 4 experts, hidden 2.
  Tensor x = tensor({3, 2}, DType::f32, {1, 2, 3, 4, 5, 6});
  Tensor ids = tensor({3, 2}, DType::i32, {0, 1, 2, 3, 1, 0});
  Tensor out = tensor({6, 2}, DType::f32, std::vector<double>(12, -7));
  Tensor off = tensor({5}, DType::i64, std::vector<double>(5, -7));
  Tensor inv = tensor({6}, DType::i32, std::vector<double>(6, -7));
  const std::vector<const Tensor*> outs = {&out, &off, &inv};
  auto call = [&](const TensorView& o, const TensorView& f, const TensorView& v, const TensorView& xx,
                  const TensorView& ii, int64_t e) { return std::vector<Value>{o, f, v, xx, ii, e}; };
  const TensorView O = out.view(), F = off.view(), V = inv.view(), X = x.view(), I = ids.view();
  expect_rejected("moe_permute", call(O, F, V, X, tensor({3, 2}, DType::i32, {0, 1, 2, 4, 1, 0}).view(), 4), "topk_ids", outs);
  expect_rejected("moe_permute", call(O, F, V, X, tensor({3, 2}, DType::i32, {0, -1, 2, 3, 1, 0}).view(), 4), "topk_ids", outs);
  expect_rejected("moe_permute", call(O, F, V, X, tensor({3, 2}, DType::i64, {0, 1, 2, 3, 1, 0}).view(), 4), "topk_ids", outs);
  expect_rejected("moe_permute", call(O, F, V, X, tensor({2, 2}, DType::i32, {0, 1, 2, 3}).view(), 4), "topk_ids", outs);
  expect_rejected("moe_permute", call(O, F, V, X, I, 0), "num_experts", outs);
  expect_rejected("moe_permute", call(O, tensor({4}, DType::i64, {}).view(), V, X, I, 4), "expert_offsets", outs);
  expect_rejected("moe_permute", call(O, tensor({5}, DType::i32, {}).view(), V, X, I, 4), "expert_offsets", outs);
  expect_rejected("moe_permute", call(O, F, tensor({5}, DType::i32, {}).view(), X, I, 4), "inv_perm", outs);
  expect_rejected("moe_permute", call(O, F, tensor({6}, DType::f32, {}).view(), X, I, 4), "inv_perm", outs);
  expect_rejected("moe_permute", call(tensor({6, 3}, DType::f32, {}).view(), F, V, X, I, 4), "permuted", outs);
  expect_rejected("moe_permute", call(tensor({6, 2}, DType::bf16, {}).view(), F, V, X, I, 4), "permuted", outs);
  expect_rejected("moe_permute", call(O, F, V, tensor({6}, DType::f32, {}).view(), I, 4), "x", outs);
  expect_rejected("moe_permute", call(O, F, V, tensor({3, 2}, DType::i32, {}).view(), I, 4), "x", outs);
  expect_rejected("moe_permute", call(O, F, F, X, I, 4), "inv_perm", outs);  // i64 of the wrong length
}

TEST(MoeChecks, UnpermuteRejectsBadArguments) {
  Tensor in = tensor({6, 2}, DType::f32, std::vector<double>(12, 1));
  Tensor inv = tensor({6}, DType::i32, {0, 1, 2, 3, 4, 5});
  Tensor w = tensor({3, 2}, DType::f32, std::vector<double>(6, 0.5));
  Tensor y = tensor({3, 2}, DType::f32, std::vector<double>(6, -7));
  const std::vector<const Tensor*> outs = {&y};
  auto call = [&](const TensorView& yy, const TensorView& e, const TensorView& v, const TensorView& ww) {
    return std::vector<Value>{yy, e, v, ww};
  };
  const TensorView Y = y.view(), E = in.view(), V = inv.view(), W = w.view();
  expect_rejected("moe_unpermute", call(Y, E, tensor({6}, DType::i32, {0, 1, 2, 3, 4, 6}).view(), W), "inv_perm", outs);
  expect_rejected("moe_unpermute", call(Y, E, tensor({6}, DType::i64, {0, -1, 2, 3, 4, 5}).view(), W), "inv_perm", outs);
  expect_rejected("moe_unpermute", call(Y, E, tensor({5}, DType::i32, {}).view(), W), "inv_perm", outs);
  expect_rejected("moe_unpermute", call(Y, E, tensor({6}, DType::f32, {}).view(), W), "inv_perm", outs);
  expect_rejected("moe_unpermute", call(Y, E, V, tensor({3, 2}, DType::bf16, {}).view()), "topk_weights", outs);
  expect_rejected("moe_unpermute", call(Y, E, V, tensor({6}, DType::f32, {}).view()), "topk_weights", outs);
  expect_rejected("moe_unpermute", call(Y, tensor({5, 2}, DType::f32, {}).view(), V, W), "expert_out", outs);
  expect_rejected("moe_unpermute", call(Y, tensor({6, 2}, DType::i32, {}).view(), V, W), "expert_out", outs);
  expect_rejected("moe_unpermute", call(tensor({3, 3}, DType::f32, {}).view(), E, V, W), "y", outs);
  expect_rejected("moe_unpermute", call(tensor({3, 2}, DType::f16, {}).view(), E, V, W), "y", outs);
  // y overlapping expert_out
  Tensor both = tensor({6, 2}, DType::f32, {});
  const TensorView head(both.data(), DType::f32, Shape{3, 2});
  expect_rejected("moe_unpermute", call(head, both.view(), V, W), "y", {&both});
}

// ids (k = 2) of 4 tokens: pairs p = 0..7 go to experts 2 0 | 1 2 | 0 0 | 3 2. Stable order:
// expert 0: p 1, 4, 5; expert 1: p 2; expert 2: p 0, 3, 7; expert 3: p 6; expert 4: none.
TEST(MoeValues, PermuteIsStableInPairOrder) {
  for (DType inv_dtype : {DType::i32, DType::i64})
    for (const char* impl : {"reference", "cpu"}) {
      SCOPED_TRACE(std::string(impl) + " " + dtype_name(inv_dtype));
      Tensor x = tensor({4, 3}, DType::f32, {0, 0.5, 1, 10, 10.5, 11, 20, 20.5, 21, 30, 30.5, 31});
      Tensor ids = tensor({4, 2}, DType::i32, {2, 0, 1, 2, 0, 0, 3, 2});
      Tensor out = tensor({8, 3}, DType::f32, {}), off = tensor({6}, DType::i64, {}),
             inv = tensor({8}, inv_dtype, {});
      run_impl("moe_permute", {out.view(), off.view(), inv.view(), x.view(), ids.view(), int64_t(5)}, impl);
      EXPECT_EQ(values_of(off), (std::vector<double>{0, 3, 4, 7, 8, 8}));
      // rows: p1 p4 p5 | p2 | p0 p3 p7 | p6; inv_perm[p] = row of p.
      EXPECT_EQ(values_of(inv), (std::vector<double>{4, 0, 3, 5, 1, 2, 7, 6}));
      const std::vector<double> token_of_row = {0, 2, 2, 1, 0, 1, 3, 3};
      std::vector<double> want;
      for (double t : token_of_row)
        for (int h = 0; h < 3; ++h) want.push_back(10 * t + 0.5 * h);
      EXPECT_EQ(values_of(out), want);

      // Combine back with weights: y[t] = sum_j w[t, j] * x[t] = (w0 + w1) x[t].
      Tensor w = tensor({4, 2}, DType::f32, {0.25, 0.75, 0.5, 0.5, 1, 2, 0.125, 0});
      Tensor y = tensor({4, 3}, DType::f32, {});
      run_impl("moe_unpermute", {y.view(), out.view(), inv.view(), w.view()}, impl);
      const std::vector<double> scale = {1, 1, 3, 0.125};
      std::vector<double> y_want;
      for (int t = 0; t < 4; ++t)
        for (int h = 0; h < 3; ++h) y_want.push_back(scale[size_t(t)] * (10 * t + 0.5 * h));
      EXPECT_EQ(values_of(y), y_want);
    }
}

}  // namespace
}  // namespace opforge
