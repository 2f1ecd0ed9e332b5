// The layernorm family (ops/layernorm): argument checks of every op (the error names the
// argument; a rejected call writes nothing), reference kernels against hand-computed values, the
// cpu kernels against the reference (optional inputs absent, padded rows, rows with a large
// mean), deterministic parameter gradients across thread counts, registration.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/cpu_info.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/layernorm/internal.h"
#include "tests/test_util.h"

namespace opforge {
namespace {

using test_util::Buf;
using test_util::make;
using test_util::get;
using test_util::set;
using test_util::expect_padding_untouched;
using test_util::rtol_of;
using test_util::expect_arg_error;

const Context kCtx{};
constexpr DType kKernelDtypes[] = {DType::f32, DType::bf16, DType::f16};

// ---- tensors ---------------------------------------------------------------------------------
// N(0, 1) * scale + shift, or U(0.5, 1.5) when positive.
Buf random(const Shape& shape, DType dtype, uint32_t seed, int64_t pad = 0, bool positive = false,
           double shift = 0) {
  Buf b = make(shape, dtype, pad);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.5, 1.5);
  for (int64_t row = 0; row < b.view.rows(); ++row)
    for (int64_t i = 0; i < b.view.size(-1); ++i)
      set(b.view, row, i, positive ? uniform(gen) : normal(gen) + shift);
  return b;
}

Buf values(const Shape& shape, DType dtype, const std::vector<double>& v) {
  Buf b = make(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) store_from_double(b.view.data, dtype, int64_t(i), v[i]);
  return b;
}

// |a - r| <= rtol * (|r| + floor * max|r|) + rtol / 2 for every element: the absolute term is
// the harness's default atol (Note [tolerances]); f32 sums of rows and cancellations (y near 0,
// dx of a one-element row) are exact only to that.
void expect_close(const TensorView& a, const TensorView& r, double rtol, double floor = 1e-3,
                  const char* what = "") {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.shape_of(), r.shape_of());
  double max_ref = 0;
  for (int64_t row = 0; row < r.rows(); ++row)
    for (int64_t i = 0; i < r.size(-1); ++i) max_ref = std::max(max_ref, std::abs(get(r, row, i)));
  for (int64_t row = 0; row < r.rows(); ++row)
    for (int64_t i = 0; i < r.size(-1); ++i) {
      const double av = get(a, row, i), rv = get(r, row, i);
      ASSERT_LE(std::abs(av - rv), rtol * (std::abs(rv) + floor * max_ref) + rtol / 2)
          << "at row " << row << ", column " << i << ": got " << av << ", reference " << rv;
    }
}

bool same_bytes(const Buf& a, const Buf& b) {
  return a.storage.nbytes() == b.storage.nbytes() &&
         std::memcmp(a.storage.data(), b.storage.data(), size_t(a.storage.nbytes())) == 0;
}

// ---- argument checks -----------------------------------------------------------------------------
TEST(LayernormChecks, LayerNormRejectsBadArguments) {
  Buf x = random({4, 64}, DType::f32, 1), w = random({64}, DType::f32, 2, 0, true);
  Buf b = random({64}, DType::f32, 3), y = make({4, 64}, DType::f32);
  auto check = [&](const TensorView& y, const TensorView& x, const TensorView& w,
                   const TensorView& b, double eps = 1e-5) { LayerNorm::check(y, x, w, b, eps); };
  EXPECT_NO_THROW(check(y, x, w, b));
  EXPECT_NO_THROW(check(y, x, w, TensorView{}));  // no bias
  EXPECT_NO_THROW(check(x, x, w, b));             // in place
  expect_arg_error([&] { check(y, x, make({63}, DType::f32), b); }, "w",
                   "layer_norm: argument 'w': expected shape [64], got [63]");
  expect_arg_error([&] { check(y, x, w, make({65}, DType::f32)); }, "b", "expected shape [64]");
  expect_arg_error([&] { check(y, x, w, make({64}, DType::bf16)); }, "b", "dtype f32");
  expect_arg_error([&] { check(make({4, 65}, DType::f32), x, w, b); }, "y", "shape [4, 64]");
  expect_arg_error([&] { check(y, make({4, 64}, DType::i32), w, b); }, "x", "floating dtype");
  expect_arg_error([&] { check(y, TensorView{}, w, b); }, "x", "got none");
  expect_arg_error([&] { check(y, x, TensorView{}, b); }, "w", "got none");
  expect_arg_error([&] { check(y, x, w, b, -1.0); }, "eps", ">= 0");
  expect_arg_error([&] { check(y, x, w, b, NAN); }, "eps", "got nan");
  expect_arg_error([&] { check(y, x, w, TensorView(y.view.data, DType::f32, Shape{64})); }, "y",
                   "no overlap with 'b'");
  TensorView transposed(x.view.data, DType::f32, Shape{4, 64}, std::vector<int64_t>{1, 4});
  expect_arg_error([&] { check(y, transposed, w, b); }, "x", "Note [row layout]");
  Buf dx = make({4, 64}, DType::f32), dw = make({64}, DType::f32), db = make({64}, DType::f32);
  EXPECT_NO_THROW(LayerNormBackward::check(dx, dw, db, x, x, w, 1e-5));
  expect_arg_error([&] { LayerNormBackward::check(dx, dw, make({63}, DType::f32), x, x, w, 1e-5); },
                   "db", "shape [64]");
  expect_arg_error([&] { LayerNormBackward::check(dx, dw, dw, x, x, w, 1e-5); }, "db",
                   "no overlap with 'dw'");
  expect_arg_error([&] { LayerNormBackward::check(x, dw, db, y, x, w, 1e-5); }, "dx",
                   "no overlap with 'x'");
  expect_arg_error([&] { LayerNormBackward::check(dx, dw, db, make({4, 64}, DType::f16), x, w, 1e-5); },
                   "dy", "dtype f32");
}

TEST(LayernormChecks, GroupNormRejectsBadArguments) {
  Buf x = random({2, 8, 5}, DType::bf16, 1), w = random({8}, DType::bf16, 2, 0, true);
  Buf b = random({8}, DType::bf16, 3), y = make({2, 8, 5}, DType::bf16);
  auto check = [&](const TensorView& y, const TensorView& x, int64_t groups, double eps = 1e-5) {
    GroupNorm::check(y, x, w, b, groups, eps);
  };
  EXPECT_NO_THROW(check(y, x, 4));
  EXPECT_NO_THROW(check(x, x, 8));  // in place
  expect_arg_error([&] { check(y, x, 3); }, "num_groups", "a divisor of the channel count 8, got 3");
  expect_arg_error([&] { check(y, x, 0); }, "num_groups", "got 0");
  expect_arg_error([&] { check(y, x, -2); }, "num_groups", "got -2");
  expect_arg_error([&] { check(y, make({8}, DType::bf16), 2); }, "x", "at least 2");
  Buf padded = make({2, 8, 5}, DType::bf16, 3);
  expect_arg_error([&] { check(y, padded, 4); }, "x", "contiguous");
  expect_arg_error([&] { check(padded, x, 4); }, "y", "contiguous");
  expect_arg_error([&] { GroupNorm::check(y, x, make({7}, DType::bf16), b, 4, 1e-5); }, "w",
                   "shape [8]");
  expect_arg_error([&] { GroupNorm::check(y, x, w, TensorView{}, 4, 1e-5); }, "b", "got none");
  expect_arg_error([&] { check(y, x, 4, INFINITY); }, "eps");
  Buf dx = make({2, 8, 5}, DType::bf16), dw = make({8}, DType::bf16), db = make({8}, DType::bf16);
  EXPECT_NO_THROW(GroupNormBackward::check(dx, dw, db, x, x, w, 4, 1e-5));
  expect_arg_error([&] { GroupNormBackward::check(dx, dw, db, x, x, w, 5, 1e-5); }, "num_groups");
  expect_arg_error([&] { GroupNormBackward::check(dx, dw, db, make({2, 8, 4}, DType::bf16), x, w, 4, 1e-5); },
                   "dy", "shape [2, 8, 5]");
  expect_arg_error([&] { GroupNormBackward::check(dx, dw, w, x, x, w, 4, 1e-5); }, "db",
                   "no overlap with 'w'");
}

TEST(LayernormChecks, DytRejectsBadArguments) {
  Buf x = random({3, 40}, DType::f16, 1), alpha = values({1}, DType::f16, {0.5});
  Buf gamma = random({40}, DType::f16, 2, 0, true), beta = random({40}, DType::f16, 3);
  Buf y = make({3, 40}, DType::f16);
  EXPECT_NO_THROW(Dyt::check(y, x, alpha, gamma, beta));
  EXPECT_NO_THROW(Dyt::check(y, x, alpha, gamma, TensorView{}));
  EXPECT_NO_THROW(Dyt::check(x, x, alpha, gamma, beta));
  expect_arg_error([&] { Dyt::check(y, x, make({2}, DType::f16), gamma, beta); }, "alpha",
                   "expected shape [1], got [2]");
  expect_arg_error([&] { Dyt::check(y, x, make({1}, DType::f32), gamma, beta); }, "alpha", "dtype f16");
  expect_arg_error([&] { Dyt::check(y, x, TensorView{}, gamma, beta); }, "alpha", "got none");
  expect_arg_error([&] { Dyt::check(y, x, alpha, make({41}, DType::f16), beta); }, "gamma", "[40]");
  expect_arg_error([&] { Dyt::check(y, x, alpha, gamma, make({39}, DType::f16)); }, "beta", "[40]");
  expect_arg_error([&] { Dyt::check(make({3, 41}, DType::f16), x, alpha, gamma, beta); }, "y");
  Buf dx = make({3, 40}, DType::f16), da = make({1}, DType::f16);
  Buf dg = make({40}, DType::f16), dbeta = make({40}, DType::f16);
  EXPECT_NO_THROW(DytBackward::check(dx, da, dg, dbeta, x, x, alpha, gamma));
  expect_arg_error([&] { DytBackward::check(dx, make({40}, DType::f16), dg, dbeta, x, x, alpha, gamma); },
                   "dalpha", "shape [1]");
  expect_arg_error([&] { DytBackward::check(dx, da, dg, dg, x, x, alpha, gamma); }, "dbeta",
                   "no overlap with 'dgamma'");
  expect_arg_error([&] { DytBackward::check(dx, alpha, dg, dbeta, x, x, alpha, gamma); }, "dalpha",
                   "no overlap with 'alpha'");
}

// Through the registry's boxed call: a rejected call writes nothing.
TEST(LayernormChecks, RejectedCallsLeaveOutputsUntouched) {
  Registry reg;
  register_layernorm(reg);
  Buf x = random({4, 64}, DType::f32, 1), w = random({64}, DType::f32, 2, 0, true);
  Buf b = random({64}, DType::f32, 3), alpha = values({1}, DType::f32, {0.5});
  Buf x3 = random({2, 64, 2}, DType::f32, 4);
  Buf y = make({4, 64}, DType::f32), y3 = make({2, 64, 2}, DType::f32);
  Buf dw = make({64}, DType::f32), db = make({64}, DType::f32), da = make({1}, DType::f32);
  const std::vector<std::pair<std::string, std::vector<Value>>> calls = {
      {"layer_norm", {y.view, x.view, w.view, b.view, -1.0}},
      {"layer_norm", {y.view, x.view, w.view, make({63}, DType::f32).view, 1e-5}},
      {"layer_norm_backward", {y.view, dw.view, db.view, x.view, x.view, w.view, NAN}},
      {"group_norm", {y3.view, x3.view, w.view, b.view, int64_t(5), 1e-5}},
      {"group_norm_backward", {y3.view, dw.view, db.view, x3.view, x3.view, w.view, int64_t(0), 1e-5}},
      {"dyt", {y.view, x.view, make({2}, DType::f32).view, w.view, b.view}},
      {"dyt_backward", {y.view, da.view, dw.view, dw.view, x.view, x.view, alpha.view, w.view}},
  };
  for (const auto& [op, args] : calls) {
    SCOPED_TRACE(op);
    std::vector<std::vector<unsigned char>> before;
    for (const Buf* buf : {&y, &y3, &dw, &db, &da})
      before.emplace_back(static_cast<unsigned char*>(buf->storage.data()),
                          static_cast<unsigned char*>(buf->storage.data()) + buf->storage.nbytes());
    EXPECT_THROW(reg.call(op, args), Error);
    size_t k = 0;
    for (const Buf* buf : {&y, &y3, &dw, &db, &da})
      EXPECT_EQ(std::memcmp(before[k++].data(), buf->storage.data(), size_t(buf->storage.nbytes())), 0);
  }
}

// ---- reference kernels: hand-computed values -----------------------------------------------------
void expect_values(const TensorView& t, const std::vector<double>& expected, double tol) {
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(load_as_double(t.data, t.dtype, int64_t(i)), expected[i], tol) << "element " << i;
}

TEST(LayernormReference, HandExamples) {
  // layer_norm of [1, 2, 3, 4]: mean 2.5, variance 1.25 (biased), eps 0.
  Buf x = values({1, 4}, DType::f64, {1, 2, 3, 4});
  Buf w = values({4}, DType::f64, {1, 2, 1, 1}), b = values({4}, DType::f64, {0, 0, 0, 10});
  Buf y = make({1, 4}, DType::f64);
  const double r = 1 / std::sqrt(1.25);
  layer_norm_reference(kCtx, y, x, w, b, 0.0);
  expect_values(y, {-1.5 * r, -1.0 * r, 0.5 * r, 1.5 * r + 10}, 1e-12);
  layer_norm_reference(kCtx, y, x, w, TensorView{}, 0.0);
  expect_values(y, {-1.5 * r, -1.0 * r, 0.5 * r, 1.5 * r}, 1e-12);
  // group_norm of [1, 2 channels, 2 positions] in one group is layer_norm of the 4 values with
  // per-channel w, b.
  Buf xg = values({1, 2, 2}, DType::f64, {1, 2, 3, 4});
  Buf wg = values({2}, DType::f64, {1, 3}), bg = values({2}, DType::f64, {0, 1});
  Buf yg = make({1, 2, 2}, DType::f64);
  group_norm_reference(kCtx, yg, xg, wg, bg, 1, 0.0);
  expect_values(yg, {-1.5 * r, -0.5 * r, 1.5 * r + 1, 4.5 * r + 1}, 1e-12);
  // Two groups of one channel each: each channel normalised on its own ([-1, 1] each).
  group_norm_reference(kCtx, yg, xg, wg, bg, 2, 0.0);
  expect_values(yg, {-1, 1, -3 + 1, 3 + 1}, 1e-12);
  // dyt: gamma * tanh(alpha x) + beta with alpha 0.5.
  Buf xd = values({1, 2}, DType::f64, {0, 2}), alpha = values({1}, DType::f64, {0.5});
  Buf gamma = values({2}, DType::f64, {2, 3}), beta = values({2}, DType::f64, {1, -1});
  Buf yd = make({1, 2}, DType::f64);
  dyt_reference(kCtx, yd, xd, alpha, gamma, beta);
  expect_values(yd, {1, 3 * std::tanh(1.0) - 1}, 1e-12);
  // dyt backward with dy = 1: dx = alpha gamma (1 - t^2), dalpha = sum x gamma (1 - t^2).
  Buf dy = values({1, 2}, DType::f64, {1, 1}), dx = make({1, 2}, DType::f64);
  Buf da = make({1}, DType::f64), dg = make({2}, DType::f64), dbeta = make({2}, DType::f64);
  dyt_backward_reference(kCtx, dx, da, dg, dbeta, dy, xd, alpha, gamma);
  const double t = std::tanh(1.0);
  expect_values(dx, {0.5 * 2, 0.5 * 3 * (1 - t * t)}, 1e-12);
  expect_values(da, {2 * 3 * (1 - t * t)}, 1e-12);
  expect_values(dg, {0, t}, 1e-12);
  expect_values(dbeta, {1, 1}, 1e-12);
}

TEST(LayernormReference, LayerNormBackwardOfAConstantRow) {
  // A constant row normalises to 0 whatever its value: dw = 0, db = sum dy, and only the
  // mean-subtraction term of dx is left.
  Buf x = values({2, 3}, DType::f64, {5, 5, 5, -2, -2, -2}), dy = values({2, 3}, DType::f64, {1, 2, 3, 4, 5, 6});
  Buf w = values({3}, DType::f64, {1, 1, 1});
  Buf dx = make({2, 3}, DType::f64), dw = make({3}, DType::f64), db = make({3}, DType::f64);
  layer_norm_backward_reference(kCtx, dx, dw, db, dy, x, w, 1e-5);
  const double r = 1 / std::sqrt(1e-5);  // xhat = 0, so dx = rstd * (g - mean(g))
  expect_values(dx, {-r, 0, r, -r, 0, r}, 1e-9);
  expect_values(dw, {0, 0, 0}, 1e-12);
  expect_values(db, {5, 7, 9}, 1e-12);
}

// ---- cpu kernels against the reference -------------------------------------------------------------
struct Layout {
  Shape shape;
  int64_t in_pad = 0, out_pad = 0;
  double shift = 0;  // added to x: rows with a large mean
};

std::vector<Layout> row_layouts() {
  return {{{0, 64}}, {{1, 1}}, {{3, 67}}, {{4, 4096}}, {{2, 3, 40}}, {{5, 67}, 8, 5},
          {{6, 1000}, 0, 0, 100.0}};
}

TEST(LayernormCpu, LayerNormMatchesReference) {
  for (DType t : kKernelDtypes)
    for (const Layout& l : row_layouts())
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + l.shape.str() + (with_bias ? "" : " no bias"));
        const int64_t hidden = l.shape[l.shape.ndim - 1];
        Buf x = random(l.shape, t, 11, l.in_pad, false, l.shift), w = random({hidden}, t, 12, 0, true);
        Buf b = random({hidden}, t, 13), y = make(l.shape, t, l.out_pad), y_ref = make(l.shape, t);
        const TensorView bias = with_bias ? b.view : TensorView{};
        layer_norm_cpu(kCtx, y, x, w, bias, 1e-5);
        layer_norm_reference(kCtx, y_ref, x, w, bias, 1e-5);
        expect_close(y, y_ref, rtol_of(t), 1e-3, "y");
        expect_padding_untouched(y);
        Buf dy = random(l.shape, t, 14, l.in_pad), dx = make(l.shape, t, l.out_pad);
        Buf dw = make({hidden}, t), db = make({hidden}, t);
        Buf dx_ref = make(l.shape, t), dw_ref = make({hidden}, t), db_ref = make({hidden}, t);
        layer_norm_backward_cpu(kCtx, dx, dw, db, dy, x, w, 1e-5);
        layer_norm_backward_reference(kCtx, dx_ref, dw_ref, db_ref, dy, x, w, 1e-5);
        expect_close(dx, dx_ref, rtol_of(t), 1e-2, "dx");
        expect_close(dw, dw_ref, rtol_of(t) * 5, 1e-2, "dw");
        expect_close(db, db_ref, rtol_of(t) * 5, 1e-2, "db");
        expect_padding_untouched(dx);
      }
}

// An outlier as the first element of every row (the kernels shift by it, Note [centred sums]):
// f32 statistics stay as accurate as for any other row.
TEST(LayernormCpu, OutlierFirstElementKeepsF32Accuracy) {
  const Shape shape{8, 4096};
  Buf x = random(shape, DType::f32, 61), w = random({4096}, DType::f32, 62, 0, true);
  Buf dy = random(shape, DType::f32, 63);
  for (int64_t row = 0; row < 8; ++row) set(x.view, row, 0, row % 2 ? -30.0 : 30.0);
  Buf y = make(shape, DType::f32), y_ref = make(shape, DType::f32);
  layer_norm_cpu(kCtx, y, x, w, TensorView{}, 1e-5);
  layer_norm_reference(kCtx, y_ref, x, w, TensorView{}, 1e-5);
  expect_close(y, y_ref, 1e-5, 0.0, "y");
  Buf dx = make(shape, DType::f32), dw = make({4096}, DType::f32), db = make({4096}, DType::f32);
  Buf dx_ref = make(shape, DType::f32), dw_ref = make({4096}, DType::f32), db_ref = make({4096}, DType::f32);
  layer_norm_backward_cpu(kCtx, dx, dw, db, dy, x, w, 1e-5);
  layer_norm_backward_reference(kCtx, dx_ref, dw_ref, db_ref, dy, x, w, 1e-5);
  expect_close(dx, dx_ref, 1e-5, 0.0, "dx");
  // dw sums 8 rows' products in f32 in the SIMD target's lane order (AVX-512 differs from AVX2):
  // a cancellation of those sums can reach a few f32 ulps of the largest term.
  expect_close(dw, dw_ref, 2e-5, 0.0, "dw");
  const Shape gshape{2, 8, 512};  // group_norm: the first element of each group an outlier
  Buf xg = random(gshape, DType::f32, 64), wg = random({8}, DType::f32, 65, 0, true);
  Buf bg = random({8}, DType::f32, 66), yg = make(gshape, DType::f32), yg_ref = make(gshape, DType::f32);
  for (int64_t group = 0; group < 4; ++group) store_from_double(xg.view.data, DType::f32, group * 2048, 30.0);
  group_norm_cpu(kCtx, yg, xg, wg, bg, 2, 1e-5);
  group_norm_reference(kCtx, yg_ref, xg, wg, bg, 2, 1e-5);
  expect_close(yg, yg_ref, 1e-5, 0.0, "y");
}

TEST(LayernormCpu, GroupNormMatchesReference) {
  struct G { Shape shape; int64_t groups; };
  const std::vector<G> shapes = {{{0, 8, 4}, 2}, {{1, 1}, 1}, {{2, 6, 0}, 3}, {{2, 32, 9}, 32},
                                 {{3, 10, 67}, 5}, {{2, 4, 4097}, 2}, {{3, 6, 5, 7}, 3}};
  for (DType t : kKernelDtypes)
    for (const G& g : shapes) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + g.shape.str());
      const int64_t c = g.shape[1];
      Buf x = random(g.shape, t, 21), w = random({c}, t, 22, 0, true), b = random({c}, t, 23);
      Buf y = make(g.shape, t), y_ref = make(g.shape, t);
      group_norm_cpu(kCtx, y, x, w, b, g.groups, 1e-5);
      group_norm_reference(kCtx, y_ref, x, w, b, g.groups, 1e-5);
      expect_close(y, y_ref, rtol_of(t), 1e-3, "y");
      Buf dy = random(g.shape, t, 24), dx = make(g.shape, t), dx_ref = make(g.shape, t);
      Buf dw = make({c}, t), db = make({c}, t), dw_ref = make({c}, t), db_ref = make({c}, t);
      group_norm_backward_cpu(kCtx, dx, dw, db, dy, x, w, g.groups, 1e-5);
      group_norm_backward_reference(kCtx, dx_ref, dw_ref, db_ref, dy, x, w, g.groups, 1e-5);
      expect_close(dx, dx_ref, rtol_of(t), 1e-2, "dx");
      expect_close(dw, dw_ref, rtol_of(t) * 5, 1e-2, "dw");
      expect_close(db, db_ref, rtol_of(t) * 5, 1e-2, "db");
    }
}

TEST(LayernormCpu, DytMatchesReferenceAndSaturates) {
  for (DType t : kKernelDtypes)
    for (const Layout& l : row_layouts())
      for (bool with_beta : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + l.shape.str());
        const int64_t hidden = l.shape[l.shape.ndim - 1];
        Buf x = random(l.shape, t, 31, l.in_pad, false, l.shift), alpha = values({1}, t, {0.7});
        Buf gamma = random({hidden}, t, 32, 0, true), beta = random({hidden}, t, 33);
        Buf y = make(l.shape, t, l.out_pad), y_ref = make(l.shape, t);
        const TensorView shift = with_beta ? beta.view : TensorView{};
        dyt_cpu(kCtx, y, x, alpha, gamma, shift);
        dyt_reference(kCtx, y_ref, x, alpha, gamma, shift);
        expect_close(y, y_ref, rtol_of(t), 1e-3, "y");
        expect_padding_untouched(y);
        Buf dy = random(l.shape, t, 34, l.in_pad), dx = make(l.shape, t, l.out_pad);
        Buf da = make({1}, t), dg = make({hidden}, t), dbeta = make({hidden}, t);
        Buf dx_ref = make(l.shape, t), da_ref = make({1}, t), dg_ref = make({hidden}, t), dbeta_ref = make({hidden}, t);
        dyt_backward_cpu(kCtx, dx, da, dg, dbeta, dy, x, alpha, gamma);
        dyt_backward_reference(kCtx, dx_ref, da_ref, dg_ref, dbeta_ref, dy, x, alpha, gamma);
        expect_close(dx, dx_ref, rtol_of(t), 1e-2, "dx");
        expect_close(dg, dg_ref, rtol_of(t) * 5, 1e-2, "dg");
        expect_close(dbeta, dbeta_ref, rtol_of(t) * 5, 1e-2, "dbeta");
        if (l.shape.numel() > 0) {
          EXPECT_NEAR(get(da, 0, 0), get(da_ref, 0, 0), 1e-2 * (1 + std::abs(get(da_ref, 0, 0))));
        }
      }
  // tanh saturates to exactly +-1 far out, and is odd.
  Buf x = values({1, 4}, DType::f32, {1e4, -1e4, 30, -0.25}), alpha = values({1}, DType::f32, {1});
  Buf gamma = values({4}, DType::f32, {1, 1, 1, 1}), y = make({1, 4}, DType::f32);
  dyt_cpu(kCtx, y, x, alpha, gamma, TensorView{});
  expect_values(y, {1, -1, 1, std::tanh(-0.25)}, 1e-6);
}

TEST(LayernormCpu, InPlaceMatchesOutOfPlace) {
  for (DType t : kKernelDtypes) {
    Buf x = random({9, 300}, t, 41), w = random({300}, t, 42, 0, true), b = random({300}, t, 43);
    Buf y = make({9, 300}, t);
    layer_norm_cpu(kCtx, y, x, w, b, 1e-5);
    layer_norm_cpu(kCtx, x, x, w, b, 1e-5);
    EXPECT_TRUE(same_bytes(x, y)) << dtype_name(t);
    Buf xg = random({2, 8, 33}, t, 44), wg = random({8}, t, 45, 0, true), bg = random({8}, t, 46);
    Buf yg = make({2, 8, 33}, t);
    group_norm_cpu(kCtx, yg, xg, wg, bg, 4, 1e-5);
    group_norm_cpu(kCtx, xg, xg, wg, bg, 4, 1e-5);
    EXPECT_TRUE(same_bytes(xg, yg)) << dtype_name(t);
    Buf xd = random({9, 300}, t, 47), alpha = values({1}, t, {0.5}), yd = make({9, 300}, t);
    dyt_cpu(kCtx, yd, xd, alpha, w, b);
    dyt_cpu(kCtx, xd, xd, alpha, w, b);
    EXPECT_TRUE(same_bytes(xd, yd)) << dtype_name(t);
  }
}

TEST(LayernormCpu, ParameterGradientsAreDeterministicAcrossThreadCounts) {
  const Shape shape{1000, 96}, gshape{12, 96, 40};
  for (DType t : {DType::f32, DType::bf16}) {
    Buf x = random(shape, t, 51), dy = random(shape, t, 52), w = random({96}, t, 53, 0, true);
    Buf xg = random(gshape, t, 54), dyg = random(gshape, t, 55), alpha = values({1}, t, {0.6});
    std::vector<std::vector<Buf>> runs;
    for (int threads : {1, 2, 3, 1}) {
      const int saved = cpu::set_thread_count_for_testing(threads);
      std::vector<Buf> out;
      for (int k = 0; k < 7; ++k) out.push_back(make({96}, t));
      Buf dx = make(shape, t), dxg = make(gshape, t), da = make({1}, t);
      layer_norm_backward_cpu(kCtx, dx, out[0], out[1], dy, x, w, 1e-5);
      group_norm_backward_cpu(kCtx, dxg, out[2], out[3], dyg, xg, w, 8, 1e-5);
      dyt_backward_cpu(kCtx, dx, da, out[4], out[5], dy, x, alpha, w);
      std::memcpy(out[6].storage.data(), da.storage.data(), size_t(da.storage.nbytes()));
      cpu::set_thread_count_for_testing(saved);
      runs.push_back(std::move(out));
    }
    for (const auto& run : runs)
      for (size_t k = 0; k < run.size(); ++k) EXPECT_TRUE(same_bytes(run[k], runs[0][k])) << k;
  }
}

// ---- registration ---------------------------------------------------------------------------------
TEST(LayernormRegistry, OpsKernelsCasesAndShapes) {
  Registry reg;
  register_layernorm(reg);
  for (const char* name : {"layer_norm", "layer_norm_backward", "group_norm", "group_norm_backward",
                           "dyt", "dyt_backward"}) {
    SCOPED_TRACE(name);
    const OpEntry& op = reg.op(name);
    ASSERT_NE(op.reference(), nullptr);
    const KernelEntry* cpu = op.kernel("cpu", DeviceKind::cpu);
    ASSERT_NE(cpu, nullptr);
    EXPECT_TRUE(cpu->claims(DType::bf16));
    EXPECT_FALSE(cpu->claims(DType::f64));
    ASSERT_TRUE(op.cases && op.outputs && op.cost);
    std::set<std::string> labels, groups;
    for (const Case& c : op.cases()) {
      EXPECT_TRUE(labels.insert(c.label).second) << "duplicate label " << c.label;
      groups.insert(case_group_name(c.group));
      for (const CaseArg& a : c.args) EXPECT_NO_THROW(op.arg_index(a.name)) << a.name;
    }
    EXPECT_EQ(groups.size(), 4u);
  }
  // layer_norm without bias: one output, bytes x + y + w.
  const OpEntry& op = reg.op("layer_norm");
  Buf x = random({4, 64}, DType::f32, 1), w = random({64}, DType::f32, 2, 0, true);
  const std::vector<Value> args = {None{}, x.view, w.view, None{}, 1e-5};
  const std::vector<OutputSpec> outs = op.outputs(ArgList(op.name, op.args, args));
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].shape, Shape({4, 64}));
  EXPECT_EQ(op.cost(ArgList(op.name, op.args, args)).bytes, 4.0 * (256 + 256 + 64));
  // dyt_backward: dalpha is [1].
  const OpEntry& dyt = reg.op("dyt_backward");
  Buf alpha = values({1}, DType::f32, {0.5});
  const std::vector<Value> dargs = {None{}, None{}, None{}, None{}, x.view, x.view, alpha.view, w.view};
  const std::vector<OutputSpec> douts = dyt.outputs(ArgList(dyt.name, dyt.args, dargs));
  ASSERT_EQ(douts.size(), 4u);
  EXPECT_EQ(douts[1].shape, Shape({1}));
  // f64 goes to the reference; f32 to the cpu kernel.
  Buf x64 = random({2, 8}, DType::f64, 4), w64 = random({8}, DType::f64, 5, 0, true);
  Buf y64 = make({2, 8}, DType::f64), y32 = make({4, 64}, DType::f32);
  const std::vector<Value> call64 = {y64.view, x64.view, w64.view, None{}, 1e-5};
  const std::vector<Value> call32 = {y32.view, x.view, w.view, None{}, 1e-5};
  EXPECT_EQ(reg.call("layer_norm", call64).impl(), "reference");
  EXPECT_EQ(reg.call("layer_norm", call32).impl(), "cpu");
}

}  // namespace
}  // namespace opforge
