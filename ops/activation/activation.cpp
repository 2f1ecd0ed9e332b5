// Activation family: checks, shape functions, cost models and registration (activation.h).
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "ops/activation/internal.h"
#include "opforge/checks.h"
#include "opforge/error.h"

namespace opforge {

namespace {

// ---- checks ----------------------------------------------------------------------------------

// x: a row tensor whose last dim (2d) splits into gate and up values.
void check_gated_input(const char* op, const TV& x) {
  expect_row_tensor(op, "x", x);
  expect_even_last_dim(op, "x", x);
}

// x's shape with the last dim halved: the shape of y and dy of a gated op.
Shape half_shape(const TV& x) {
  Shape s = x.shape_of();
  s.dims[size_t(s.ndim - 1)] /= 2;
  return s;
}

// A row tensor of x's dtype and device with the given shape.
void check_row_output(const char* op, const char* arg, const TV& t, const TV& x,
                      const Shape& shape) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, "x", x);
  expect_shape(op, arg, t, shape);
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, "x", x);
}

// y ([..., d]) overlaps nothing: no in-place form, as y and x differ in shape.
void check_gated(const char* op, const TV& y, const TV& x) {
  check_gated_input(op, x);
  check_row_output(op, "y", y, x, half_shape(x));
  expect_no_overlap(op, "y", y, "x", x);
}

// dx overlaps neither input (each element of dx depends on both gate and up).
void check_gated_backward(const char* op, const TV& dx, const TV& dy, const TV& x) {
  check_gated_input(op, x);
  check_row_output(op, "dy", dy, x, half_shape(x));
  check_row_output(op, "dx", dx, x, x.shape_of());
  expect_no_overlap(op, "dx", dx, "dy", dy);
  expect_no_overlap(op, "dx", dx, "x", x);
}

// y has x's shape and may be x itself (in place).
void check_pointwise(const char* op, const TV& y, const TV& x) {
  expect_row_tensor(op, "x", x);
  check_row_output(op, "y", y, x, x.shape_of());
  expect_no_overlap(op, "y", y, "x", x, Aliasing::exact);
}

// dx may be dy itself (in place); it overlaps x nowhere.
void check_pointwise_backward(const char* op, const TV& dx, const TV& dy, const TV& x) {
  expect_row_tensor(op, "x", x);
  check_row_output(op, "dy", dy, x, x.shape_of());
  check_row_output(op, "dx", dx, x, x.shape_of());
  expect_no_overlap(op, "dx", dx, "dy", dy, Aliasing::exact);
  expect_no_overlap(op, "dx", dx, "x", x);
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void check_approximate(const char* op, std::string_view approximate) {
  if (approximate != "none" && approximate != "tanh")
    throw_argument_error(op, "approximate", "\"none\" or \"tanh\"",
                         "\"" + std::string(approximate) + "\"");
}

void check_oai_scalars(const char* op, double alpha, double limit) {
  expect_finite_scalar(op, "alpha", alpha);
  if (!std::isfinite(limit) || !(limit > 0))
    throw_argument_error(op, "limit", "a finite value > 0", number(limit));
}

void check_xielu_scalars(const char* op, double alpha_p, double alpha_n, double beta, double eps) {
  expect_finite_scalar(op, "alpha_p", alpha_p);
  expect_finite_scalar(op, "alpha_n", alpha_n);
  expect_finite_scalar(op, "beta", beta);
  if (!std::isfinite(eps) || eps > 0)
    throw_argument_error(op, "eps", "a finite value <= 0", number(eps));
}

}  // namespace

// Scalars are checked first: a bad scalar is reported even when a tensor is also wrong.
void SiluAndMul::check(const TV& y, const TV& x) { check_gated(name, y, x); }
void SiluAndMulBackward::check(const TV& dx, const TV& dy, const TV& x) {
  check_gated_backward(name, dx, dy, x);
}
void MulAndSilu::check(const TV& y, const TV& x) { check_gated(name, y, x); }
void MulAndSiluBackward::check(const TV& dx, const TV& dy, const TV& x) {
  check_gated_backward(name, dx, dy, x);
}
void GeluAndMul::check(const TV& y, const TV& x, std::string_view approximate) {
  check_approximate(name, approximate);
  check_gated(name, y, x);
}
void GeluAndMulBackward::check(const TV& dx, const TV& dy, const TV& x,
                               std::string_view approximate) {
  check_approximate(name, approximate);
  check_gated_backward(name, dx, dy, x);
}
void FatreluAndMul::check(const TV& y, const TV& x, double threshold) {
  expect_finite_scalar(name, "threshold", threshold);
  check_gated(name, y, x);
}
void FatreluAndMulBackward::check(const TV& dx, const TV& dy, const TV& x, double threshold) {
  expect_finite_scalar(name, "threshold", threshold);
  check_gated_backward(name, dx, dy, x);
}
void SwigluoaiAndMul::check(const TV& y, const TV& x, double alpha, double limit) {
  check_oai_scalars(name, alpha, limit);
  check_gated(name, y, x);
}
void SwigluoaiAndMulBackward::check(const TV& dx, const TV& dy, const TV& x, double alpha,
                                    double limit) {
  check_oai_scalars(name, alpha, limit);
  check_gated_backward(name, dx, dy, x);
}

#define OPFORGE_POINTWISE_CHECKS(Name)                                                      \
  void Name::check(const TV& y, const TV& x) { check_pointwise(name, y, x); }               \
  void Name##Backward::check(const TV& dx, const TV& dy, const TV& x) {                     \
    check_pointwise_backward(name, dx, dy, x);                                              \
  }
OPFORGE_POINTWISE_CHECKS(GeluNew)
OPFORGE_POINTWISE_CHECKS(GeluFast)
OPFORGE_POINTWISE_CHECKS(QuickGelu)
OPFORGE_POINTWISE_CHECKS(Relu2)
#undef OPFORGE_POINTWISE_CHECKS

void Xielu::check(const TV& y, const TV& x, double alpha_p, double alpha_n, double beta,
                  double eps) {
  check_xielu_scalars(name, alpha_p, alpha_n, beta, eps);
  check_pointwise(name, y, x);
}
void XieluBackward::check(const TV& dx, const TV& dy, const TV& x, double alpha_p,
                          double alpha_n, double beta, double eps) {
  check_xielu_scalars(name, alpha_p, alpha_n, beta, eps);
  check_pointwise_backward(name, dx, dy, x);
}

namespace {

// ---- registration ------------------------------------------------------------------------------

// What a kernel of the family is, for the registry's tables.
struct Family {
  bool gated;
  bool backward;
  double flops_per_element;  // per output element of the forward (per gated pair backward)
  const char* cpu_summary;
};

// Shape function and cost: a gated forward reads x (2 per output) and writes y; its backward
// reads x and dy and writes dx; a pointwise forward reads x and writes y; its backward reads x
// and dy and writes dx. Flops count the exp as one.
template <class Op> void describe(OpEntry& op, const Family& f) {
  const char* out = f.backward ? "dx" : "y";
  const bool gated = f.gated, backward = f.backward;
  op.outputs = [out, gated, backward](const ArgList& a) {
    const TV& x = a.tensor("x");
    const Shape shape = gated && !backward ? half_shape(x) : x.shape_of();
    return std::vector<OutputSpec>{{out, shape, x.dtype}};
  };
  const double bytes_per_x = gated ? (backward ? 2.5 : 1.5) : (backward ? 3.0 : 2.0);
  const double elements_per_x = gated ? 0.5 : 1.0;
  const double flops = f.flops_per_element;
  op.cost = [=](const ArgList& a) {
    const TV& x = a.tensor("x");
    return Cost{bytes_per_x * bytes_of(x), flops * elements_per_x * double(x.numel())};
  };
}

template <class Op, class Ref, class Cpu, class Pred>
void add(Registry& reg, const Family& f, std::function<std::vector<Case>()> cases, Ref ref,
         Cpu cpu, Pred pred) {
  OpEntry& op = reg.add_op<Op>();
  describe<Op>(op, f);
  op.cases = std::move(cases);
  const bool in_place = !f.gated;  // pointwise: y = x (forward), dx = dy (backward)
  reg.add_kernel<Op>(
      reference_kernel_desc("plain loops, double arithmetic, one rounding per output", in_place),
      ref);
  reg.add_kernel<Op>(cpu_kernel_desc(f.cpu_summary, in_place), cpu, pred);
}

constexpr const char* kCpuGated =
    "Highway SIMD (runtime ISA dispatch) + OpenMP over L1-sized tiles, f32 math, streaming "
    "stores past the last-level cache";
constexpr const char* kCpuPointwise =
    "Highway SIMD + OpenMP over L1-sized tiles, f32 math, in place allowed, streaming stores "
    "past the last-level cache";

// Flops per output element: silu 7 (-|a|, exp, 1 + e, reciprocal, select, a * s, * b);
// gelu erf ~16 (polynomial in t); tanh forms 10; fatrelu 2; swigluoai 11; relu2 2; xielu 8.
// Backward per gated pair (or pointwise element): about twice the forward.
Family gated_fwd(double flops) { return {true, false, flops, kCpuGated}; }
Family gated_bwd(double flops) { return {true, true, flops, kCpuGated}; }
Family point_fwd(double flops) { return {false, false, flops, kCpuPointwise}; }
Family point_bwd(double flops) { return {false, true, flops, kCpuPointwise}; }

std::vector<CaseArg> no_scalars() { return {}; }

}  // namespace

void register_activation(Registry& reg) {
  auto gated = [](std::vector<CaseArg> s) { return [s] { return gated_cases(false, s); }; };
  auto gated_b = [](std::vector<CaseArg> s) { return [s] { return gated_cases(true, s); }; };
  auto point = [](std::vector<CaseArg> s) { return [s] { return pointwise_cases(false, s); }; };
  auto point_b = [](std::vector<CaseArg> s) { return [s] { return pointwise_cases(true, s); }; };

  add<SiluAndMul>(reg, gated_fwd(7), gated(no_scalars()), &silu_and_mul_reference,
                  &silu_and_mul_cpu, &cpu_applicable_forward<>);
  add<SiluAndMulBackward>(reg, gated_bwd(12), gated_b(no_scalars()),
                          &silu_and_mul_backward_reference, &silu_and_mul_backward_cpu,
                          &cpu_applicable_backward<>);
  add<MulAndSilu>(reg, gated_fwd(7), gated(no_scalars()), &mul_and_silu_reference,
                  &mul_and_silu_cpu, &cpu_applicable_forward<>);
  add<MulAndSiluBackward>(reg, gated_bwd(12), gated_b(no_scalars()),
                          &mul_and_silu_backward_reference, &mul_and_silu_backward_cpu,
                          &cpu_applicable_backward<>);

  const std::vector<CaseArg> erf = {{"approximate", Value(std::string("none"))}};
  const std::vector<CaseArg> tanh_form = {{"approximate", Value(std::string("tanh"))}};
  auto both_gelu = [&](bool backward) {
    return [=] {
      std::vector<Case> cases = gated_cases(backward, erf);
      for (Case& c : gated_cases(backward, tanh_form)) {
        c.label += "_tanh";
        cases.push_back(std::move(c));
      }
      return cases;
    };
  };
  add<GeluAndMul>(reg, gated_fwd(16), both_gelu(false), &gelu_and_mul_reference,
                  &gelu_and_mul_cpu, &cpu_applicable_forward<std::string_view>);
  add<GeluAndMulBackward>(reg, gated_bwd(30), both_gelu(true), &gelu_and_mul_backward_reference,
                          &gelu_and_mul_backward_cpu, &cpu_applicable_backward<std::string_view>);

  const std::vector<CaseArg> threshold = {{"threshold", Value(0.25)}};
  add<FatreluAndMul>(reg, gated_fwd(2), gated(threshold), &fatrelu_and_mul_reference,
                     &fatrelu_and_mul_cpu, &cpu_applicable_forward<double>);
  add<FatreluAndMulBackward>(reg, gated_bwd(4), gated_b(threshold),
                             &fatrelu_and_mul_backward_reference, &fatrelu_and_mul_backward_cpu,
                             &cpu_applicable_backward<double>);

  // limit 1.5 so that the unit-scale inputs of the cases hit both clamps.
  const std::vector<CaseArg> oai = {{"alpha", Value(1.702)}, {"limit", Value(1.5)}};
  add<SwigluoaiAndMul>(reg, gated_fwd(11), gated(oai), &swigluoai_and_mul_reference,
                       &swigluoai_and_mul_cpu, &cpu_applicable_forward<double, double>);
  add<SwigluoaiAndMulBackward>(reg, gated_bwd(20), gated_b(oai),
                               &swigluoai_and_mul_backward_reference,
                               &swigluoai_and_mul_backward_cpu,
                               &cpu_applicable_backward<double, double>);

  add<GeluNew>(reg, point_fwd(10), point(no_scalars()), &gelu_new_reference, &gelu_new_cpu,
               &cpu_applicable_forward<>);
  add<GeluNewBackward>(reg, point_bwd(18), point_b(no_scalars()), &gelu_new_backward_reference,
                       &gelu_new_backward_cpu, &cpu_applicable_backward<>);
  add<GeluFast>(reg, point_fwd(10), point(no_scalars()), &gelu_fast_reference, &gelu_fast_cpu,
                &cpu_applicable_forward<>);
  add<GeluFastBackward>(reg, point_bwd(18), point_b(no_scalars()), &gelu_fast_backward_reference,
                        &gelu_fast_backward_cpu, &cpu_applicable_backward<>);
  add<QuickGelu>(reg, point_fwd(7), point(no_scalars()), &quick_gelu_reference, &quick_gelu_cpu,
                 &cpu_applicable_forward<>);
  add<QuickGeluBackward>(reg, point_bwd(12), point_b(no_scalars()),
                         &quick_gelu_backward_reference, &quick_gelu_backward_cpu,
                         &cpu_applicable_backward<>);
  add<Relu2>(reg, point_fwd(2), point(no_scalars()), &relu2_reference, &relu2_cpu,
             &cpu_applicable_forward<>);
  add<Relu2Backward>(reg, point_bwd(3), point_b(no_scalars()), &relu2_backward_reference,
                     &relu2_backward_cpu, &cpu_applicable_backward<>);

  const std::vector<CaseArg> xielu = {{"alpha_p", Value(0.8)}, {"alpha_n", Value(0.8)},
                                      {"beta", Value(0.5)}, {"eps", Value(-1e-6)}};
  add<Xielu>(reg, point_fwd(8), point(xielu), &xielu_reference, &xielu_cpu,
             &cpu_applicable_forward<double, double, double, double>);
  add<XieluBackward>(reg, point_bwd(12), point_b(xielu), &xielu_backward_reference,
                     &xielu_backward_cpu, &cpu_applicable_backward<double, double, double, double>);
}

}  // namespace opforge
