// The norm and activation families (ops/norm, ops/activation) and the CPU backend helpers they use
// (src/backends/cpu): argument checks, reference kernels against hand-computed values and finite
// differences, CPU kernels against the reference (f32, bf16, f16; odd sizes, no rows, padded rows,
// in place), deterministic dw, the SIMD conversions on every target, tiling, registration.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/convert.h"
#include "backends/cpu/cpu_info.h"
#include "backends/cpu/tiling.h"
#include "opforge/checks.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/activation/internal.h"
#include "ops/norm/internal.h"
#include "tests/test_util.h"

namespace opforge {
namespace {

using test_util::Buf;
using test_util::make;
using test_util::offset_of;
using test_util::get;
using test_util::set;
using test_util::expect_padding_untouched;
using test_util::rtol_of;
using test_util::expect_arg_error;

const Context kCtx{};
constexpr DType kKernelDtypes[] = {DType::f32, DType::bf16, DType::f16};

// N(0, 1) with ~1% outliers scaled by 8..32 (as the harness fills activations), or U(0.5, 1.5).
void fill(const TensorView& t, uint32_t seed, bool positive = false) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t row = 0; row < t.rows(); ++row)
    for (int64_t i = 0; i < t.size(-1); ++i) {
      double v = positive ? 0.5 + uniform(gen) : normal(gen);
      if (!positive && uniform(gen) < 0.01) v *= 8 + 24 * uniform(gen);
      set(t, row, i, v);
    }
}

Buf random(const Shape& shape, DType dtype, uint32_t seed, int64_t pad = 0, bool positive = false) {
  Buf b = make(shape, dtype, pad);
  fill(b.view, seed, positive);
  return b;
}

// |a - r| <= rtol * (|r| + floor * max|r|) + atol for every element.
void expect_close(const TensorView& a, const TensorView& r, double rtol, double floor = 1e-3,
                  double atol = 0) {
  ASSERT_EQ(a.shape_of(), r.shape_of());
  double max_ref = 0;
  for (int64_t row = 0; row < r.rows(); ++row)
    for (int64_t i = 0; i < r.size(-1); ++i) max_ref = std::max(max_ref, std::abs(get(r, row, i)));
  for (int64_t row = 0; row < r.rows(); ++row)
    for (int64_t i = 0; i < r.size(-1); ++i) {
      const double av = get(a, row, i), rv = get(r, row, i);
      ASSERT_LE(std::abs(av - rv), rtol * (std::abs(rv) + floor * max_ref) + atol)
          << "at row " << row << ", column " << i << ": got " << av << ", reference " << rv;
    }
}

bool same_bits(const TensorView& a, const TensorView& b) {
  for (int64_t row = 0; row < a.rows(); ++row)
    if (std::memcmp(static_cast<const char*>(a.data) + offset_of(a, row, 0) * a.itemsize(),
                    static_cast<const char*>(b.data) + offset_of(b, row, 0) * b.itemsize(),
                    size_t(a.size(-1) * a.itemsize())) != 0)
      return false;
  return true;
}

// ---- argument errors -------------------------------------------------------------------------
TEST(NormChecks, RmsNormRejectsBadArguments) {
  Buf x = random({4, 64}, DType::f32, 1), w = random({64}, DType::f32, 2, 0, true);
  Buf y = make({4, 64}, DType::f32);
  auto check = [](const TensorView& y, const TensorView& x, const TensorView& w, double eps = 1e-6,
                  double offset = 0.0) { RmsNorm::check(y, x, w, eps, offset); };
  EXPECT_NO_THROW(check(y, x, w));
  EXPECT_NO_THROW(check(x, x, w));  // in place: y aliases x exactly
  expect_arg_error([&] { check(y, x, make({63}, DType::f32)); }, "w",
                   "rms_norm: argument 'w': expected shape [64], got [63]");
  expect_arg_error([&] { check(make({4, 65}, DType::f32), x, w); }, "y", "expected shape [4, 64]");
  expect_arg_error([&] { check(y, make({4, 64}, DType::i32), w); }, "x", "floating dtype");
  expect_arg_error([&] { check(y, x, make({64}, DType::bf16)); }, "w", "expected dtype f32");
  expect_arg_error([&] { check(make({4, 64}, DType::f16), x, w); }, "y", "got f16");
  expect_arg_error([&] { check(y, TensorView{}, w); }, "x", "got none");
  expect_arg_error([&] { check(y, x, w, -1.0); }, "eps", "expected a finite value >= 0, got -1");
  expect_arg_error([&] { check(y, x, w, NAN); }, "eps", "got nan");
  expect_arg_error([&] { check(y, x, w, 1e-6, INFINITY); }, "offset", "got inf");
  // y shifted by one element against x: a partial overlap.
  Buf big = make({5, 64}, DType::f32);
  TensorView shifted(static_cast<float*>(big.view.data) + 1, DType::f32, Shape{4, 64});
  TensorView base(big.view.data, DType::f32, Shape{4, 64});
  expect_arg_error([&] { check(shifted, base, w); }, "y", "partial overlap");
  expect_arg_error([&] { check(y, x, TensorView(y.view.data, DType::f32, Shape{64})); }, "y",
                   "no overlap with 'w'");
  // Transposed x (last dim not unit stride) breaks Note [row layout].
  TensorView transposed(x.view.data, DType::f32, Shape{4, 64}, std::vector<int64_t>{1, 4});
  expect_arg_error([&] { check(y, transposed, w); }, "x", "Note [row layout]");
}

TEST(NormChecks, FusedAddRmsNormAliasing) {
  Buf x = random({3, 40}, DType::bf16, 1), r = random({3, 40}, DType::bf16, 2);
  Buf w = random({40}, DType::bf16, 3, 0, true);
  Buf y = make({3, 40}, DType::bf16), s = make({3, 40}, DType::bf16);
  auto check = [&](const TensorView& y, const TensorView& s, const TensorView& x,
                   const TensorView& r) { FusedAddRmsNorm::check(y, s, x, r, w, 1e-6, 0.0); };
  EXPECT_NO_THROW(check(y, s, x, r));
  EXPECT_NO_THROW(check(x, r, x, r));  // vLLM's in-place form
  expect_arg_error([&] { check(r, s, x, r); }, "y", "no overlap with 'residual'");
  expect_arg_error([&] { check(y, x, x, r); }, "s", "no overlap with 'x'");
  expect_arg_error([&] { check(y, y, x, r); }, "y", "no overlap with 's'");
  expect_arg_error([&] { check(y, s, x, make({3, 41}, DType::bf16)); }, "residual", "shape");
  expect_arg_error([&] { check(y, s, x, make({3, 40}, DType::f32)); }, "residual", "dtype bf16");
  Buf big = make({4, 40}, DType::bf16);
  TensorView shifted(static_cast<bf16_t*>(big.view.data) + 3, DType::bf16, Shape{3, 40});
  TensorView base(big.view.data, DType::bf16, Shape{3, 40});
  expect_arg_error([&] { check(shifted, s, base, r); }, "y", "partial overlap");
  expect_arg_error([&] { FusedAddRmsNorm::check(y, s, x, r, w, -1e-3, 0.0); }, "eps");
}

TEST(NormChecks, BackwardOpsRejectBadArguments) {
  Buf x = random({3, 40}, DType::f32, 1), dy = random({3, 40}, DType::f32, 2);
  Buf w = random({40}, DType::f32, 3, 0, true);
  Buf dx = make({3, 40}, DType::f32), dw = make({40}, DType::f32);
  EXPECT_NO_THROW(RmsNormBackward::check(dx, dw, dy, x, w, 1e-6, 0.0));
  expect_arg_error([&] { RmsNormBackward::check(dx, make({41}, DType::f32), dy, x, w, 1e-6, 0); },
                   "dw", "expected shape [40]");
  expect_arg_error([&] { RmsNormBackward::check(dy, dw, dy, x, w, 1e-6, 0); }, "dx",
                   "no overlap with 'dy'");
  expect_arg_error([&] { RmsNormBackward::check(dx, make({40}, DType::f64), dy, x, w, 1e-6, 0); },
                   "dw", "dtype f32");
  Buf ds = random({3, 40}, DType::f32, 4), r = random({3, 40}, DType::f32, 5);
  Buf dr = make({3, 40}, DType::f32);
  EXPECT_NO_THROW(FusedAddRmsNormBackward::check(dx, dr, dw, dy, ds, x, r, w, 1e-6, 0));
  EXPECT_NO_THROW(FusedAddRmsNormBackward::check(dx, dx, dw, dy, ds, x, r, w, 1e-6, 0));
  expect_arg_error(
      [&] { FusedAddRmsNormBackward::check(dx, ds, dw, dy, ds, x, r, w, 1e-6, 0); }, "dresidual",
      "no overlap with 'ds'");
  expect_arg_error(
      [&] { FusedAddRmsNormBackward::check(dx, dr, dw, dy, ds, x, r, w, 1e-6, NAN); }, "offset");
}

TEST(ActivationChecks, SiluAndMulRejectsBadArguments) {
  Buf x = random({4, 10}, DType::f16, 1), y = make({4, 5}, DType::f16);
  EXPECT_NO_THROW(SiluAndMul::check(y, x));
  expect_arg_error([&] { SiluAndMul::check(make({4, 4}, DType::f16), make({4, 9}, DType::f16)); },
                   "x", "an even last dim, got 9");
  expect_arg_error([&] { SiluAndMul::check(make({4, 10}, DType::f16), x); }, "y",
                   "expected shape [4, 5], got [4, 10]");
  expect_arg_error([&] { SiluAndMul::check(make({4, 5}, DType::bf16), x); }, "y", "dtype f16");
  TensorView inside(x.view.data, DType::f16, Shape{4, 5}, std::vector<int64_t>{10, 1});
  expect_arg_error([&] { SiluAndMul::check(inside, x); }, "y", "no overlap with 'x'");
  Buf dy = random({4, 5}, DType::f16, 2), dx = make({4, 10}, DType::f16);
  EXPECT_NO_THROW(SiluAndMulBackward::check(dx, dy, x));
  expect_arg_error([&] { SiluAndMulBackward::check(x, dy, x); }, "dx", "no overlap with 'x'");
  expect_arg_error([&] { SiluAndMulBackward::check(dx, make({4, 6}, DType::f16), x); }, "dy",
                   "expected shape [4, 5]");
}

// Through the registry's boxed call: a rejected call writes nothing.
TEST(NormChecks, RejectedCallsLeaveOutputsUntouched) {
  Registry reg;
  register_norm(reg);
  register_activation(reg);
  Buf x = random({4, 64}, DType::f32, 1), w = random({64}, DType::f32, 2, 0, true);
  Buf r = random({4, 64}, DType::f32, 3);
  Buf y = make({4, 64}, DType::f32), s = make({4, 64}, DType::f32);
  Buf big = make({5, 64}, DType::f32);
  TensorView shifted(static_cast<float*>(big.view.data) + 1, DType::f32, Shape{4, 64});
  TensorView base(big.view.data, DType::f32, Shape{4, 64});
  Buf ys = make({4, 3}, DType::f32);
  const std::vector<std::pair<std::string, std::vector<Value>>> calls = {
      {"rms_norm", {y.view, x.view, w.view, -1.0, 0.0}},
      {"rms_norm", {y.view, x.view, make({63}, DType::f32).view, 1e-6, 0.0}},
      {"fused_add_rms_norm", {y.view, shifted, base, r.view, w.view, 1e-6, 0.0}},
      {"fused_add_rms_norm", {y.view, s.view, x.view, r.view, w.view, 1e-6, NAN}},
      {"silu_and_mul", {ys.view, make({4, 7}, DType::f32).view}},
  };
  for (const auto& [op, args] : calls) {
    SCOPED_TRACE(op);
    std::vector<std::vector<unsigned char>> before;
    for (const Buf* b : {&y, &s, &big, &ys})
      before.emplace_back(static_cast<unsigned char*>(b->storage.data()),
                          static_cast<unsigned char*>(b->storage.data()) + b->storage.nbytes());
    EXPECT_THROW(reg.call(op, args), Error);
    size_t k = 0;
    for (const Buf* b : {&y, &s, &big, &ys})
      EXPECT_EQ(std::memcmp(before[k++].data(), b->storage.data(), size_t(b->storage.nbytes())), 0);
  }
}

// ---- reference kernels: hand-computed values -------------------------------------------------
Buf from_values(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Buf b = make(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) store_from_double(b.view.data, dtype, int64_t(i), values[i]);
  return b;
}

void expect_values(const TensorView& t, const std::vector<double>& expected, double tol) {
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(load_as_double(t.data, t.dtype, int64_t(i)), expected[i], tol) << "element " << i;
}

TEST(NormReference, RmsNormHandExample) {
  // x = [1, 2, 3, 4]: mean(x^2) = 7.5, rstd = 1/sqrt(7.5) = 0.365148371670111.
  Buf x = from_values({1, 4}, DType::f64, {1, 2, 3, 4});
  Buf w = from_values({4}, DType::f64, {1, 0.5, 2, -1});
  Buf y = make({1, 4}, DType::f64);
  rms_norm_reference(kCtx, y, x, w, 0.0, 0.0);
  expect_values(y.view, {0.365148371670111, 0.365148371670111, 2.19089023002067, -1.46059348668044},
                1e-13);
  rms_norm_reference(kCtx, y, x, w, 0.0, 1.0);  // Gemma: (1 + w)
  expect_values(y.view, {0.730296743340221, 1.09544511501033, 3.28633534503100, 0.0}, 1e-13);
  rms_norm_reference(kCtx, y, x, w, 2.5, 0.0);  // eps: rstd = 1/sqrt(10)
  expect_values(y.view, {0.316227766016838, 0.316227766016838, 1.89736659610103, -1.26491106406735},
                1e-13);
}

TEST(NormReference, FusedAddHandExampleRoundsTheSum) {
  // s = x + residual = [4, 1] (exact); mean(s^2) = 8.5, y = s / sqrt(8.5).
  Buf x = from_values({1, 2}, DType::f32, {1, 2}), r = from_values({1, 2}, DType::f32, {3, -1});
  Buf w = from_values({2}, DType::f32, {1, 1}), y = make({1, 2}, DType::f32), s = make({1, 2}, DType::f32);
  fused_add_rms_norm_reference(kCtx, y, s, x, r, w, 0.0, 0.0);
  expect_values(s.view, {4, 1}, 0);
  expect_values(y.view, {1.37198868114007, 0.342997170285018}, 1e-6);
  // bf16: 256 + 1 = 257 is not a bf16 value; s is rounded (to even: 256) before the norm.
  Buf xb = from_values({1, 2}, DType::bf16, {256, 1}), rb = from_values({1, 2}, DType::bf16, {1, 0});
  Buf wb = from_values({2}, DType::bf16, {1, 1});
  Buf yb = make({1, 2}, DType::bf16), sb = make({1, 2}, DType::bf16);
  fused_add_rms_norm_reference(kCtx, yb, sb, xb, rb, wb, 0.0, 0.0);
  expect_values(sb.view, {256, 1}, 0);
  // y = s / sqrt((256^2 + 1) / 2) = [1.41420, 0.00552...] -> bf16 [1.4140625, 0.005523681640625]
  expect_values(yb.view, {1.4140625, 0.005523681640625}, 0);
}

TEST(ActivationReference, SiluAndMulHandExample) {
  // a = [0, 1, -2], b = [1, 2, 3]: silu(0) = 0, silu(1) = 0.731058578630005,
  // silu(-2) = -2 / (1 + e^2) = -0.238405844044235.
  Buf x = from_values({1, 6}, DType::f64, {0, 1, -2, 1, 2, 3}), y = make({1, 3}, DType::f64);
  silu_and_mul_reference(kCtx, y, x);
  expect_values(y.view, {0.0, 1.46211715726001, -0.715217532132705}, 1e-13);
  // Backward with dy = 1: da = b * s * (1 + a (1 - s)), db = silu(a).
  Buf dy = from_values({1, 3}, DType::f64, {1, 1, 1}), dx = make({1, 6}, DType::f64);
  silu_and_mul_backward_reference(kCtx, dx, dy, x);
  expect_values(dx.view, {0.5, 1.85534102374297, -0.272352746354686, 0.0, 0.731058578630005,
                          -0.238405844044235},
                1e-13);
}

// ---- reference backward = finite differences of the reference forward (f64) ----------------
// d/dv of sum(dy * forward(v)) at every element of `v`, by central differences.
std::vector<double> numeric_grad(const TensorView& v, const std::function<double()>& loss) {
  std::vector<double> g;
  const double h = 1e-6;
  for (int64_t row = 0; row < v.rows(); ++row)
    for (int64_t i = 0; i < v.size(-1); ++i) {
      const double orig = get(v, row, i);
      set(v, row, i, orig + h);
      const double up = loss();
      set(v, row, i, orig - h);
      const double down = loss();
      set(v, row, i, orig);
      g.push_back((up - down) / (2 * h));
    }
  return g;
}

double dot(const TensorView& a, const TensorView& b) {
  double sum = 0;
  for (int64_t row = 0; row < a.rows(); ++row)
    for (int64_t i = 0; i < a.size(-1); ++i) sum += get(a, row, i) * get(b, row, i);
  return sum;
}

void expect_grad(const TensorView& analytic, const std::vector<double>& numeric) {
  size_t k = 0;
  for (int64_t row = 0; row < analytic.rows(); ++row)
    for (int64_t i = 0; i < analytic.size(-1); ++i, ++k)
      EXPECT_NEAR(get(analytic, row, i), numeric[k], 1e-6 * (1 + std::abs(numeric[k])))
          << "row " << row << ", column " << i;
}

TEST(NormReference, BackwardMatchesFiniteDifferences) {
  const DType t = DType::f64;
  for (double offset : {0.0, 1.0}) {
    Buf x = random({3, 7}, t, 1), w = random({7}, t, 2, 0, true), dy = random({3, 7}, t, 3);
    Buf y = make({3, 7}, t), dx = make({3, 7}, t), dw = make({7}, t);
    auto loss = [&] {
      rms_norm_reference(kCtx, y, x, w, 1e-3, offset);
      return dot(y, dy);
    };
    rms_norm_backward_reference(kCtx, dx, dw, dy, x, w, 1e-3, offset);
    expect_grad(dx, numeric_grad(x, loss));
    expect_grad(dw, numeric_grad(w, loss));
  }
  // fused: loss = sum(dy * y) + sum(ds * s); both x and residual get dx.
  Buf x = random({2, 9}, t, 4), r = random({2, 9}, t, 5), w = random({9}, t, 6, 0, true);
  Buf dy = random({2, 9}, t, 7), ds = random({2, 9}, t, 8);
  Buf y = make({2, 9}, t), s = make({2, 9}, t);
  Buf dx = make({2, 9}, t), dr = make({2, 9}, t), dw = make({9}, t);
  auto loss = [&] {
    fused_add_rms_norm_reference(kCtx, y, s, x, r, w, 1e-3, 0.5);
    return dot(y, dy) + dot(s, ds);
  };
  fused_add_rms_norm_backward_reference(kCtx, dx, dr, dw, dy, ds, x, r, w, 1e-3, 0.5);
  expect_grad(dx, numeric_grad(x, loss));
  expect_grad(dr, numeric_grad(r, loss));
  expect_grad(dw, numeric_grad(w, loss));
}

TEST(ActivationReference, BackwardMatchesFiniteDifferences) {
  Buf x = random({3, 10}, DType::f64, 1), dy = random({3, 5}, DType::f64, 2);
  Buf y = make({3, 5}, DType::f64), dx = make({3, 10}, DType::f64);
  auto loss = [&] {
    silu_and_mul_reference(kCtx, y, x);
    return dot(y, dy);
  };
  silu_and_mul_backward_reference(kCtx, dx, dy, x);
  expect_grad(dx, numeric_grad(x, loss));
}

// ---- cpu kernels against the reference -------------------------------------------------------
struct Layout {
  Shape shape;
  int64_t in_pad = 0, out_pad = 0;
};

std::vector<Layout> norm_layouts() {
  return {{{0, 64}},         {{1, 1}},      {{4, 64}},        {{7, 33}},
          {{3, 67}},         {{5, 4097}},   {{16, 4096}},     {{2, 3, 40}},
          {{5, 67}, 8, 0},   {{5, 67}, 0, 5}, {{3, 4097}, 3, 3}, {{300, 96}}};
}

std::string describe(DType t, const Layout& l) {
  return std::string(dtype_name(t)) + l.shape.str() + " pad " + std::to_string(l.in_pad) + "/" +
         std::to_string(l.out_pad);
}

void check_rms_norm(DType t, const Layout& l, double offset) {
  const int64_t hidden = l.shape[l.shape.ndim - 1];
  Buf x = random(l.shape, t, 11, l.in_pad), w = random({hidden}, t, 12, 0, true);
  Buf y = make(l.shape, t, l.out_pad), y_ref = make(l.shape, t);
  rms_norm_cpu(kCtx, y, x, w, 1e-6, offset);
  rms_norm_reference(kCtx, y_ref, x, w, 1e-6, offset);
  expect_close(y, y_ref, rtol_of(t));
  expect_padding_untouched(y);
}

void check_fused_add(DType t, const Layout& l) {
  const int64_t hidden = l.shape[l.shape.ndim - 1];
  Buf x = random(l.shape, t, 21, l.in_pad), r = random(l.shape, t, 22, l.in_pad);
  Buf w = random({hidden}, t, 23, 0, true);
  Buf y = make(l.shape, t, l.out_pad), s = make(l.shape, t, l.out_pad);
  Buf y_ref = make(l.shape, t), s_ref = make(l.shape, t);
  fused_add_rms_norm_cpu(kCtx, y, s, x, r, w, 1e-6, 0.0);
  fused_add_rms_norm_reference(kCtx, y_ref, s_ref, x, r, w, 1e-6, 0.0);
  EXPECT_TRUE(same_bits(s, s_ref)) << "s is x + residual rounded once";
  expect_close(y, y_ref, rtol_of(t));
  expect_padding_untouched(y);
  expect_padding_untouched(s);
}

// dx = rstd*m - coef*x cancels (completely when hidden is 1): its error scales with the terms,
// max over the rows of |rstd * m|, m = dy * (w + offset), not with dx itself.
double backward_term_scale(const TensorView& dy, const TensorView& v, const TensorView& w,
                           double offset) {
  double scale = 0;
  for (int64_t row = 0; row < v.rows(); ++row) {
    double sum_sq = 0;
    for (int64_t i = 0; i < v.size(-1); ++i) sum_sq += get(v, row, i) * get(v, row, i);
    const double rstd = 1 / std::sqrt(sum_sq / double(v.size(-1)) + 1e-6);
    for (int64_t i = 0; i < v.size(-1); ++i)
      scale = std::max(scale, std::abs(rstd * get(dy, row, i) * (get(w, 0, i) + offset)));
  }
  return scale;
}

void check_norm_backward(DType t, const Layout& l, bool fused) {
  const int64_t hidden = l.shape[l.shape.ndim - 1];
  Buf x = random(l.shape, t, 31, l.in_pad), dy = random(l.shape, t, 32, l.in_pad);
  Buf r = random(l.shape, t, 33, l.in_pad), ds = random(l.shape, t, 34, l.in_pad);
  Buf w = random({hidden}, t, 35, 0, true);
  Buf dx = make(l.shape, t, l.out_pad), dr = make(l.shape, t, l.out_pad), dw = make({hidden}, t);
  Buf dx_ref = make(l.shape, t), dr_ref = make(l.shape, t), dw_ref = make({hidden}, t);
  Buf s_ref = make(l.shape, t), y_ref = make(l.shape, t);  // s = x + residual, for the scale
  if (fused) fused_add_rms_norm_reference(kCtx, y_ref, s_ref, x, r, w, 1e-6, 1.0);
  if (fused) {
    fused_add_rms_norm_backward_cpu(kCtx, dx, dr, dw, dy, ds, x, r, w, 1e-6, 1.0);
    fused_add_rms_norm_backward_reference(kCtx, dx_ref, dr_ref, dw_ref, dy, ds, x, r, w, 1e-6, 1.0);
    expect_close(dr, dr_ref, rtol_of(t), 1e-3,
                 1e-2 * rtol_of(t) * backward_term_scale(dy, s_ref, w, 1.0));
    expect_padding_untouched(dr);
  } else {
    rms_norm_backward_cpu(kCtx, dx, dw, dy, x, w, 1e-6, 1.0);
    rms_norm_backward_reference(kCtx, dx_ref, dw_ref, dy, x, w, 1e-6, 1.0);
  }
  const double atol = 1e-2 * rtol_of(t) * backward_term_scale(dy, fused ? s_ref.view : x.view, w, 1.0);
  expect_close(dx, dx_ref, rtol_of(t), 1e-3, atol);
  expect_close(dw, dw_ref, rtol_of(t) * 5);  // a sum over rows in f32
  expect_padding_untouched(dx);
}

void check_silu(DType t, const Layout& l) {
  Shape half = l.shape;
  half.dims[size_t(half.ndim - 1)] /= 2;
  Buf x = random(l.shape, t, 41, l.in_pad), dy = random(half, t, 42, l.in_pad);
  Buf y = make(half, t, l.out_pad), y_ref = make(half, t);
  silu_and_mul_cpu(kCtx, y, x);
  silu_and_mul_reference(kCtx, y_ref, x);
  expect_close(y, y_ref, rtol_of(t), 1e-4);
  expect_padding_untouched(y);
  Buf dx = make(l.shape, t, l.out_pad), dx_ref = make(l.shape, t);
  silu_and_mul_backward_cpu(kCtx, dx, dy, x);
  silu_and_mul_backward_reference(kCtx, dx_ref, dy, x);
  expect_close(dx, dx_ref, rtol_of(t), 1e-4);
  expect_padding_untouched(dx);
}

TEST(NormCpu, MatchesReference) {
  for (DType t : kKernelDtypes)
    for (const Layout& l : norm_layouts()) {
      SCOPED_TRACE(describe(t, l));
      check_rms_norm(t, l, 0.0);
      check_rms_norm(t, l, 1.0);
      check_fused_add(t, l);
      check_norm_backward(t, l, false);
      check_norm_backward(t, l, true);
    }
}

TEST(ActivationCpu, MatchesReference) {
  const std::vector<Layout> layouts = {{{0, 128}},   {{1, 2}},         {{4, 128}},
                                       {{7, 66}},    {{3, 134}},       {{5, 8194}},
                                       {{2, 28672}}, {{2, 3, 40}},     {{5, 134}, 8, 0},
                                       {{5, 134}, 0, 5}, {{3, 8194}, 3, 3}, {{300, 96}}};
  for (DType t : kKernelDtypes)
    for (const Layout& l : layouts) {
      SCOPED_TRACE(describe(t, l));
      check_silu(t, l);
    }
}

TEST(ActivationCpu, ExtremeGatesStayFinite) {
  // sigmoid from exp(-|a|): no overflow for large |a|; silu(-100) ~ 0, silu(100) = 100.
  Buf x = from_values({1, 8}, DType::f32, {-100, 100, -1e30, 1e30, 1, 1, 1, 1});
  Buf y = make({1, 4}, DType::f32), y_ref = make({1, 4}, DType::f32);
  silu_and_mul_cpu(kCtx, y, x);
  silu_and_mul_reference(kCtx, y_ref, x);
  EXPECT_NEAR(load_as_double(y.view.data, DType::f32, 0), 0.0, 1e-30);
  EXPECT_EQ(load_as_double(y.view.data, DType::f32, 1), 100.0);
  EXPECT_EQ(load_as_double(y.view.data, DType::f32, 2), 0.0);
  EXPECT_EQ(load_as_double(y.view.data, DType::f32, 3), double(1e30f));
  expect_close(y, y_ref, 1e-6);
}

// In place (y = x; s = residual) gives the out-of-place bits, for cpu and reference kernels.
TEST(NormCpu, InPlaceMatchesOutOfPlace) {
  using RmsFn = void(const Context&, const TensorView&, const TensorView&, const TensorView&, double, double);
  using FusedFn = void(const Context&, const TensorView&, const TensorView&, const TensorView&,
                       const TensorView&, const TensorView&, double, double);
  const std::pair<RmsFn*, FusedFn*> kernels[] = {{&rms_norm_cpu, &fused_add_rms_norm_cpu},
                                                 {&rms_norm_reference, &fused_add_rms_norm_reference}};
  for (DType t : kKernelDtypes)
    for (const auto& [rms, fused] : kernels) {
      SCOPED_TRACE(dtype_name(t));
      const Shape shape{37, 67};
      Buf x = random(shape, t, 51, 5), r = random(shape, t, 52, 5), w = random({67}, t, 53, 0, true);
      Buf y = make(shape, t), s = make(shape, t);
      rms(kCtx, y, x, w, 1e-6, 0.0);
      Buf xi = make(shape, t, 5);
      copy_into(xi.view, x.view);
      rms(kCtx, xi, xi, w, 1e-6, 0.0);
      EXPECT_TRUE(same_bits(xi, y));
      fused(kCtx, y, s, x, r, w, 1e-6, 0.0);
      Buf ri = make(shape, t, 5);
      copy_into(xi.view, x.view);
      copy_into(ri.view, r.view);
      fused(kCtx, xi, ri, xi, ri, w, 1e-6, 0.0);
      EXPECT_TRUE(same_bits(xi, y));
      EXPECT_TRUE(same_bits(ri, s));
    }
}

// dw is reduced from per-chunk partials in a fixed order: the same bits for any thread count.
TEST(NormCpu, BackwardIsDeterministicAcrossThreadCounts) {
  const Shape shape{1000, 96};
  for (DType t : {DType::f32, DType::bf16}) {
    Buf x = random(shape, t, 61), dy = random(shape, t, 62), w = random({96}, t, 63, 0, true);
    std::vector<Buf> dws;
    for (int threads : {1, 2, 3, 1}) {
      const int saved = cpu::set_thread_count_for_testing(threads);
      Buf dx = make(shape, t), dw = make({96}, t);
      rms_norm_backward_cpu(kCtx, dx, dw, dy, x, w, 1e-6, 0.0);
      cpu::set_thread_count_for_testing(saved);
      dws.push_back(dw);
    }
    for (const Buf& dw : dws) EXPECT_TRUE(same_bits(dw, dws[0])) << dtype_name(t);
  }
}

// ---- SIMD targets: conversions bit-exact, kernels right, on every target this CPU runs -------
std::vector<float> conversion_inputs() {
  std::vector<float> v;
  for (uint32_t h = 0; h < 65536; ++h) {  // every bf16 value, its neighbours and its midpoints
    for (uint32_t low : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) v.push_back(f32_from_bits((h << 16) | low));
    v.push_back(f16_to_f32(uint16_t(h)));  // every f16 value and the f32 values just around it
    v.push_back(f32_from_bits(f32_bits(f16_to_f32(uint16_t(h))) + 0x1000u));
    v.push_back(f32_from_bits(f32_bits(f16_to_f32(uint16_t(h))) + 0xfffu));
  }
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 40009) v.push_back(f32_from_bits(uint32_t(u)));
  return v;
}

void check_conversions(const std::vector<float>& in) {
  const int64_t n = int64_t(in.size());
  std::vector<uint16_t> bits(in.size());
  std::vector<float> back(in.size());
  cpu::f32_to_bf16_n(in.data(), bits.data(), n);
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(bits[i], f32_to_bf16(in[i])) << "bf16 of f32 bits " << std::hex << f32_bits(in[i]);
  cpu::f32_to_f16_n(in.data(), bits.data(), n);
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(bits[i], f32_to_f16(in[i])) << "f16 of f32 bits " << std::hex << f32_bits(in[i]);
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i);
  cpu::bf16_to_f32_n(all.data(), back.data(), 65536);
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(f32_bits(back[i]), f32_bits(bf16_to_f32(all[i])));
  cpu::f16_to_f32_n(all.data(), back.data(), 65536);
  for (size_t i = 0; i < all.size(); ++i)
    ASSERT_EQ(f32_bits(back[i]), f32_bits(f16_to_f32(all[i]))) << "f16 bits " << std::hex << i;
  // Odd lengths exercise the tails.
  cpu::f32_to_bf16_n(in.data(), bits.data(), 13);
  for (size_t i = 0; i < 13; ++i) ASSERT_EQ(bits[i], f32_to_bf16(in[i]));
}

TEST(CpuSimd, EveryTargetConvertsExactlyAndRunsTheKernels) {
  const std::vector<float> inputs = conversion_inputs();
  const auto targets = cpu::simd_targets();
  ASSERT_FALSE(targets.empty());
  for (const cpu::SimdTarget& target : targets) {
    SCOPED_TRACE(target.name);
    std::printf("SIMD target %s\n", target.name.c_str());
    cpu::restrict_simd_target_for_testing(target.bit);
    EXPECT_EQ(cpu::simd_target_name(), target.name);
    check_conversions(inputs);
    for (DType t : kKernelDtypes) {
      check_rms_norm(t, {{3, 67}, 2, 1}, 1.0);
      check_fused_add(t, {{5, 33}});
      check_norm_backward(t, {{9, 67}, 1, 0}, true);
      check_silu(t, {{3, 134}, 0, 3});
    }
  }
  cpu::restrict_simd_target_for_testing(0);
}

// ---- tiling and cache sizes ------------------------------------------------------------------
TEST(CpuTiling, CapacityBlockIsTheLargestFittingPowerOfTwo) {
  cpu::TileSpec spec;
  spec.bytes_per_element = 4;
  spec.multiplier = 4096;  // 16 KiB per row
  spec.safety_margin = 0.5;
  EXPECT_EQ(cpu::capacity_block(spec, 512 << 10), 16);  // 256 KiB / 16 KiB
  EXPECT_EQ(cpu::capacity_block(spec, 500000), 8);      // 250000 / 16384 = 15.3
  EXPECT_EQ(cpu::capacity_block(spec, 1 << 10), 1);     // too big for the cache: one row
  spec.max_block = 4;
  EXPECT_EQ(cpu::capacity_block(spec, 512 << 10), 4);
  const cpu::CpuInfo& info = cpu::cpu_info();
  EXPECT_GT(info.l1d.bytes, 0);
  EXPECT_GE(info.l2.bytes, info.l1d.bytes);
  EXPECT_GT(info.threads, 0);
  std::printf("cpu: %s; SIMD target %s\n", info.str().c_str(), cpu::simd_target_name().c_str());
}

TEST(CpuTiling, PartialChunksJoinWholeTilesUpToTheBound) {
  // Note [bounded partials]: 16,384 rows in 8-row tiles (2,048 tiles) -> chunks of 16 tiles.
  const cpu::RowTasks big = cpu::partial_chunks({16384, 8});
  EXPECT_EQ(big.rows_per_task, 128);
  EXPECT_EQ(big.count(), cpu::kMaxPartialChunks);
  EXPECT_EQ(big.end(big.count() - 1), 16384);
  // 1,000 tiles of 3 rows: 8 tiles a chunk (24 rows), 125 chunks, the last one short.
  const cpu::RowTasks odd = cpu::partial_chunks({2999, 3});
  EXPECT_EQ(odd.rows_per_task, 24);
  EXPECT_EQ(odd.count(), 125);
  EXPECT_EQ(odd.end(124) - odd.begin(124), 2999 - 124 * 24);
  // Within the bound: the tiles unchanged; no rows: no chunks.
  EXPECT_EQ(cpu::partial_chunks({1024, 16}).rows_per_task, 16);
  EXPECT_EQ(cpu::partial_chunks({0, 8}).count(), 0);
  for (int64_t rows : {1, 127, 128, 129, 4097, 100000})
    EXPECT_LE(cpu::partial_chunks({rows, 1}).count(), cpu::kMaxPartialChunks) << rows;
}

TEST(CpuTiling, BalancedTasksAreAMultipleOfTheThreadsAndNoLargerThanTheBlock) {
  const int saved = cpu::set_thread_count_for_testing(2);
  const cpu::RowTasks three = cpu::balanced({192, 64});  // 3 blocks -> 4 tasks of 48 rows
  EXPECT_EQ(three.count(), 4);
  EXPECT_EQ(three.rows_per_task, 48);
  const cpu::RowTasks odd = cpu::balanced({130, 64});  // 3 blocks -> 33, 33, 33, 31
  EXPECT_EQ(odd.count(), 4);
  EXPECT_EQ(odd.end(3) - odd.begin(3), 31);
  const cpu::RowTasks even = cpu::balanced({256, 64});  // already 4: unchanged
  EXPECT_EQ(even.rows_per_task, 64);
  const cpu::RowTasks one = cpu::balanced({50, 64});  // one task stays one (no OpenMP region)
  EXPECT_EQ(one.count(), 1);
  EXPECT_EQ(cpu::balanced({0, 64}).count(), 0);
  // One block whose bytes are known: split once each thread gets min_parallel_bytes().
  const int64_t least = cpu::min_parallel_bytes();
  const cpu::RowTasks big = cpu::balanced({50, 64, least});  // 50 rows x least bytes: two tasks
  EXPECT_EQ(big.count(), 2);
  EXPECT_EQ(big.rows_per_task, 25);
  const cpu::RowTasks small = cpu::balanced({2, 64, least / 2});  // least bytes in all: one task
  EXPECT_EQ(small.count(), 1);
  EXPECT_EQ(cpu::balanced({4, 64, least / 2}).count(), 2);  // 2 x least in all: two tasks
  EXPECT_EQ(cpu::balanced({1, 64, least * 8}).count(), 1);  // one row cannot be split
  EXPECT_TRUE(cpu::single_thread_call(double(2 * least - 1)));
  EXPECT_FALSE(cpu::single_thread_call(double(2 * least)));
  cpu::TileSpec spec;
  spec.bytes_per_element = 4;
  spec.multiplier = 4096;
  const cpu::RowTasks rows = cpu::row_blocks(10, spec);
  EXPECT_EQ(rows.bytes_per_row, 4 * 4096);
  EXPECT_EQ(rows.rows_per_task, cpu::capacity_block(spec));
  cpu::set_thread_count_for_testing(1);
  EXPECT_EQ(cpu::balanced({50, 64, least}).count(), 1);  // one thread: never split
  EXPECT_TRUE(cpu::single_thread_call(1e12));
  EXPECT_EQ(cpu::balanced({192, 64}).rows_per_task, 64);  // one thread: the blocks as they are
  cpu::set_thread_count_for_testing(saved);
}

// ---- registration: ops, kernels, cases, shape functions --------------------------------------
TEST(NormActivationRegistry, OpsKernelsCasesAndShapes) {
  Registry reg;
  register_norm(reg);
  register_activation(reg);
  for (const char* name : {"rms_norm", "rms_norm_backward", "fused_add_rms_norm",
                           "fused_add_rms_norm_backward", "silu_and_mul", "silu_and_mul_backward"}) {
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
    EXPECT_TRUE(labels.count("t1024xh4096") || labels.count("t1024xi14336"));
  }
  // rms_norm on 4 x 64 f32: shapes and roofline bytes.
  const OpEntry& op = reg.op("rms_norm");
  Buf x = random({4, 64}, DType::f32, 1), w = random({64}, DType::f32, 2, 0, true);
  const std::vector<Value> values = {None{}, x.view, w.view, 1e-6, 0.0};
  ArgList args(op.name, op.args, values);
  const std::vector<OutputSpec> outs = op.outputs(args);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].name, "y");
  EXPECT_EQ(outs[0].shape, Shape({4, 64}));
  EXPECT_EQ(op.cost(args).bytes, 4.0 * (256 + 64 + 256));
  // silu_and_mul halves the last dim.
  const OpEntry& silu = reg.op("silu_and_mul");
  Buf xs = random({3, 2, 10}, DType::bf16, 3);
  const std::vector<Value> silu_values = {None{}, xs.view};
  EXPECT_EQ(silu.outputs(ArgList(silu.name, silu.args, silu_values))[0].shape, Shape({3, 2, 5}));
  // The cpu predicate sends f64 to the reference; a boxed call with the default policy runs.
  Buf x64 = random({2, 8}, DType::f64, 4), w64 = random({8}, DType::f64, 5, 0, true);
  Buf y64 = make({2, 8}, DType::f64);
  const std::vector<Value> call64 = {y64.view, x64.view, w64.view, 1e-6, 0.0};
  EXPECT_EQ(reg.call("rms_norm", call64).impl(), "reference");
  Buf y32 = make({4, 64}, DType::f32);
  const std::vector<Value> call32 = {y32.view, x.view, w.view, 1e-6, 0.0};
  EXPECT_EQ(reg.call("rms_norm", call32).impl(), "cpu");
}

}  // namespace
}  // namespace opforge
