// Norm family: checks, shape functions, cost models and registration (ops/norm/norm.h).
#include <string>
#include <utility>

#include "ops/norm/internal.h"
#include "opforge/checks.h"

namespace opforge {

// The parts every norm op shares: x a row tensor, w = [hidden] of x's dtype and device.
void norm_check_x_and_w(const char* op, const TensorView& x, const TensorView& w) {
  expect_row_tensor(op, "x", x);
  expect_defined(op, "w", w);
  expect_same_dtype(op, "w", w, "x", x);
  expect_shape(op, "w", w, Shape{x.size(-1)});
  expect_rows_uniform(op, "w", w);
  expect_same_device(op, "w", w, "x", x);
}

// A row tensor with x's dtype, shape and device.
void norm_check_like_x(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, "x", x);
  expect_same_shape(op, arg, t, "x", x);
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, "x", x);
}

// dw: [hidden] like w.
void norm_check_dw(const char* op, const TensorView& dw, const TensorView& w) {
  expect_defined(op, "dw", dw);
  expect_same_dtype(op, "dw", dw, "w", w);
  expect_same_shape(op, "dw", dw, "w", w);
  expect_rows_uniform(op, "dw", dw);
  expect_same_device(op, "dw", dw, "w", w);
}

void norm_check_scalars(const char* op, double eps, double offset) {
  expect_finite_scalar(op, "eps", eps, 0.0);
  expect_finite_scalar(op, "offset", offset);
}

// y may alias x exactly (in place); no other overlap of the output with an input.
void check_rms_norm(const char* name, const TensorView& y, const TensorView& x,
                    const TensorView& w, double eps, double offset) {
  norm_check_x_and_w(name, x, w);
  norm_check_like_x(name, "y", y, x);
  expect_no_overlap(name, "y", y, "x", x, Aliasing::exact);
  expect_no_overlap(name, "y", y, "w", w);
  norm_check_scalars(name, eps, offset);
}

// Outputs overlap nothing (no in-place form).
void check_rms_norm_backward(const char* name, const TensorView& dx, const TensorView& dw,
                             const TensorView& dy, const TensorView& x, const TensorView& w,
                             double eps, double offset) {
  norm_check_x_and_w(name, x, w);
  norm_check_like_x(name, "dy", dy, x);
  norm_check_like_x(name, "dx", dx, x);
  norm_check_dw(name, dw, w);
  const std::pair<const char*, const TensorView*> inputs[] = {{"dy", &dy}, {"x", &x}, {"w", &w}};
  for (const auto& [arg, t] : inputs) {
    expect_no_overlap(name, "dx", dx, arg, *t);
    expect_no_overlap(name, "dw", dw, arg, *t);
  }
  expect_no_overlap(name, "dw", dw, "dx", dx);
  norm_check_scalars(name, eps, offset);
}

// vLLM's in-place form: y aliasing x and s aliasing residual exactly; nothing else overlaps.
void check_fused_add_rms_norm(const char* name, const TensorView& y, const TensorView& s,
                              const TensorView& x, const TensorView& residual,
                              const TensorView& w, double eps, double offset) {
  norm_check_x_and_w(name, x, w);
  norm_check_like_x(name, "residual", residual, x);
  norm_check_like_x(name, "y", y, x);
  norm_check_like_x(name, "s", s, x);
  expect_no_overlap(name, "y", y, "x", x, Aliasing::exact);
  expect_no_overlap(name, "s", s, "residual", residual, Aliasing::exact);
  expect_no_overlap(name, "y", y, "s", s);
  expect_no_overlap(name, "y", y, "residual", residual);
  expect_no_overlap(name, "y", y, "w", w);
  expect_no_overlap(name, "s", s, "x", x);
  expect_no_overlap(name, "s", s, "w", w);
  norm_check_scalars(name, eps, offset);
}

// dx and dresidual hold the same values and may be one buffer (exact alias); no other overlap.
void check_fused_add_rms_norm_backward(const char* name, const TensorView& dx,
                                       const TensorView& dresidual, const TensorView& dw,
                                       const TensorView& dy, const TensorView& ds,
                                       const TensorView& x, const TensorView& residual,
                                       const TensorView& w, double eps, double offset) {
  norm_check_x_and_w(name, x, w);
  norm_check_like_x(name, "residual", residual, x);
  norm_check_like_x(name, "dy", dy, x);
  norm_check_like_x(name, "ds", ds, x);
  norm_check_like_x(name, "dx", dx, x);
  norm_check_like_x(name, "dresidual", dresidual, x);
  norm_check_dw(name, dw, w);
  expect_no_overlap(name, "dx", dx, "dresidual", dresidual, Aliasing::exact);
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"dy", &dy}, {"ds", &ds}, {"x", &x}, {"residual", &residual}, {"w", &w}};
  for (const auto& [arg, t] : inputs) {
    expect_no_overlap(name, "dx", dx, arg, *t);
    expect_no_overlap(name, "dresidual", dresidual, arg, *t);
    expect_no_overlap(name, "dw", dw, arg, *t);
  }
  expect_no_overlap(name, "dw", dw, "dx", dx);
  expect_no_overlap(name, "dw", dw, "dresidual", dresidual);
  norm_check_scalars(name, eps, offset);
}

void RmsNorm::check(const TensorView& y, const TensorView& x, const TensorView& w, double eps,
                    double offset) {
  check_rms_norm(name, y, x, w, eps, offset);
}
void RmsNormBackward::check(const TensorView& dx, const TensorView& dw, const TensorView& dy,
                            const TensorView& x, const TensorView& w, double eps, double offset) {
  check_rms_norm_backward(name, dx, dw, dy, x, w, eps, offset);
}
void FusedAddRmsNorm::check(const TensorView& y, const TensorView& s, const TensorView& x,
                            const TensorView& residual, const TensorView& w, double eps,
                            double offset) {
  check_fused_add_rms_norm(name, y, s, x, residual, w, eps, offset);
}
void FusedAddRmsNormBackward::check(const TensorView& dx, const TensorView& dresidual,
                                    const TensorView& dw, const TensorView& dy,
                                    const TensorView& ds, const TensorView& x,
                                    const TensorView& residual, const TensorView& w, double eps,
                                    double offset) {
  check_fused_add_rms_norm_backward(name, dx, dresidual, dw, dy, ds, x, residual, w, eps, offset);
}

namespace {

// Kernel descriptions shared by the family.
KernelDesc reference_desc(bool in_place) {
  return reference_kernel_desc("plain loops, double accumulation, one rounding per output", in_place);
}

KernelDesc cpu_desc(bool in_place, const char* summary) { return cpu_kernel_desc(summary, in_place); }

// Flops per element (see the doc strings): sum of squares 2; y = x * rstd * (w + offset) 3.
constexpr double kForwardFlops = 5;
// Backward per element: m 2, sum(m*x) 2, sum(x^2) 2, dx = rstd*m - coef*x 3, dw += dy*x*rstd 3.
constexpr double kBackwardFlops = 12;

void register_rms_norm(Registry& reg) {
  OpEntry& op = reg.add_op<RmsNorm>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"y", x.shape_of(), x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    return Cost{2 * bytes_of(x) + bytes_of(w), kForwardFlops * double(x.numel())};
  };
  op.cases = rms_norm_cases;
  reg.add_kernel<RmsNorm>(reference_desc(true), &rms_norm_reference);
  reg.add_kernel<RmsNorm>(
      cpu_desc(true, "Highway SIMD (runtime ISA dispatch) + OpenMP over row tasks, f32 math"),
      &rms_norm_cpu, &rms_norm_cpu_applicable);
}

void register_rms_norm_backward(Registry& reg) {
  OpEntry& op = reg.add_op<RmsNormBackward>();
  op.outputs = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    return std::vector<OutputSpec>{{"dx", x.shape_of(), x.dtype}, {"dw", w.shape_of(), w.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    // Reads dy, x, w; writes dx, dw.
    return Cost{3 * bytes_of(x) + 2 * bytes_of(w), kBackwardFlops * double(x.numel())};
  };
  op.cases = rms_norm_backward_cases;
  reg.add_kernel<RmsNormBackward>(reference_desc(false), &rms_norm_backward_reference);
  reg.add_kernel<RmsNormBackward>(
      with_f32_dw_tolerance(
          cpu_desc(false, "Highway SIMD + OpenMP; dw from f32 chunk partials in a fixed order")),
      &rms_norm_backward_cpu, &rms_norm_backward_cpu_applicable);
}

void register_fused_add_rms_norm(Registry& reg) {
  OpEntry& op = reg.add_op<FusedAddRmsNorm>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"y", x.shape_of(), x.dtype}, {"s", x.shape_of(), x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    // Reads x, residual, w; writes y, s. One more flop per element for the add.
    return Cost{4 * bytes_of(x) + bytes_of(w), (kForwardFlops + 1) * double(x.numel())};
  };
  op.cases = fused_add_rms_norm_cases;
  reg.add_kernel<FusedAddRmsNorm>(reference_desc(true), &fused_add_rms_norm_reference);
  reg.add_kernel<FusedAddRmsNorm>(
      cpu_desc(true, "Highway SIMD + OpenMP; add, store s and sum of squares in one pass"),
      &fused_add_rms_norm_cpu, &fused_add_rms_norm_cpu_applicable);
}

void register_fused_add_rms_norm_backward(Registry& reg) {
  OpEntry& op = reg.add_op<FusedAddRmsNormBackward>();
  op.outputs = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    return std::vector<OutputSpec>{{"dx", x.shape_of(), x.dtype},
                                   {"dresidual", x.shape_of(), x.dtype},
                                   {"dw", w.shape_of(), w.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    // Reads dy, ds, x, residual, w; writes dx, dresidual, dw. Flops: s 1, + ds 1.
    return Cost{6 * bytes_of(x) + 2 * bytes_of(w), (kBackwardFlops + 2) * double(x.numel())};
  };
  op.cases = fused_add_rms_norm_backward_cases;
  reg.add_kernel<FusedAddRmsNormBackward>(reference_desc(false),
                                          &fused_add_rms_norm_backward_reference);
  reg.add_kernel<FusedAddRmsNormBackward>(
      with_f32_dw_tolerance(
          cpu_desc(false, "Highway SIMD + OpenMP; s recomputed, dw from ordered chunk partials")),
      &fused_add_rms_norm_backward_cpu, &fused_add_rms_norm_backward_cpu_applicable);
}

}  // namespace

void register_norm(Registry& reg) {
  register_rms_norm(reg);
  register_rms_norm_backward(reg);
  register_fused_add_rms_norm(reg);
  register_fused_add_rms_norm_backward(reg);
  register_norm_variants(reg);
}

}  // namespace opforge
