// Norm family, the rms variants: gemma_rms_norm, gemma_fused_add_rms_norm, rms_norm_gated,
// poly_norm and their backward ops. Checks, shape functions, cost models, registration; the
// Gemma kernels are rms_norm's with offset = 1 (GemmaRmsNorm's doc string says why).
#include <string>
#include <utility>

#include "ops/norm/internal.h"
#include "opforge/checks.h"
#include "opforge/error.h"

namespace opforge {

// ---- checks ------------------------------------------------------------------------------------
void GemmaRmsNorm::check(const TensorView& y, const TensorView& x, const TensorView& w, double eps) {
  check_rms_norm(name, y, x, w, eps, 1.0);
}
void GemmaRmsNormBackward::check(const TensorView& dx, const TensorView& dw, const TensorView& dy,
                                 const TensorView& x, const TensorView& w, double eps) {
  check_rms_norm_backward(name, dx, dw, dy, x, w, eps, 1.0);
}
void GemmaFusedAddRmsNorm::check(const TensorView& y, const TensorView& s, const TensorView& x,
                                 const TensorView& residual, const TensorView& w, double eps) {
  check_fused_add_rms_norm(name, y, s, x, residual, w, eps, 1.0);
}
void GemmaFusedAddRmsNormBackward::check(const TensorView& dx, const TensorView& dresidual,
                                         const TensorView& dw, const TensorView& dy,
                                         const TensorView& ds, const TensorView& x,
                                         const TensorView& residual, const TensorView& w,
                                         double eps) {
  check_fused_add_rms_norm_backward(name, dx, dresidual, dw, dy, ds, x, residual, w, eps, 1.0);
}

namespace {

// The scalars of rms_norm_gated: eps >= 0, group_size 0 or a positive divisor of hidden, a known
// activation.
void check_gated_scalars(const char* op, const TensorView& x, double eps, int64_t group_size,
                         std::string_view activation) {
  expect_finite_scalar(op, "eps", eps, 0.0);
  const int64_t hidden = x.size(-1);
  if (group_size < 0 || (group_size > 0 && hidden % group_size != 0))
    throw_argument_error(op, "group_size",
                         "0 (whole last dim) or a positive divisor of hidden = " + std::to_string(hidden),
                         std::to_string(group_size));
  GateActivation act;
  if (!parse_gate_activation(activation, act))
    throw_argument_error(op, "activation", "'silu', 'swish' or 'sigmoid'",
                         "'" + std::string(activation) + "'");
}

// A [n] parameter vector of x's dtype and device (poly_norm's w and b, their gradients).
void check_param(const char* op, const char* arg, const TensorView& t, int64_t n,
                 const TensorView& x) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, "x", x);
  expect_shape(op, arg, t, Shape{n});
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, "x", x);
}

}  // namespace

// y may alias x exactly (in place); nothing else overlaps.
void RmsNormGated::check(const TensorView& y, const TensorView& x, const TensorView& z,
                         const TensorView& w, double eps, int64_t group_size, bool,
                         std::string_view activation) {
  norm_check_x_and_w(name, x, w);
  norm_check_like_x(name, "z", z, x);
  norm_check_like_x(name, "y", y, x);
  check_gated_scalars(name, x, eps, group_size, activation);
  expect_no_overlap(name, "y", y, "x", x, Aliasing::exact);
  expect_no_overlap(name, "y", y, "z", z);
  expect_no_overlap(name, "y", y, "w", w);
}

void RmsNormGatedBackward::check(const TensorView& dx, const TensorView& dz, const TensorView& dw,
                                 const TensorView& dy, const TensorView& x, const TensorView& z,
                                 const TensorView& w, double eps, int64_t group_size, bool,
                                 std::string_view activation) {
  norm_check_x_and_w(name, x, w);
  norm_check_like_x(name, "z", z, x);
  norm_check_like_x(name, "dy", dy, x);
  norm_check_like_x(name, "dx", dx, x);
  norm_check_like_x(name, "dz", dz, x);
  norm_check_dw(name, dw, w);
  check_gated_scalars(name, x, eps, group_size, activation);
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"dy", &dy}, {"x", &x}, {"z", &z}, {"w", &w}};
  for (const auto& [arg, t] : inputs) {
    expect_no_overlap(name, "dx", dx, arg, *t);
    expect_no_overlap(name, "dz", dz, arg, *t);
    expect_no_overlap(name, "dw", dw, arg, *t);
  }
  expect_no_overlap(name, "dz", dz, "dx", dx);
  expect_no_overlap(name, "dw", dw, "dx", dx);
  expect_no_overlap(name, "dw", dw, "dz", dz);
}

void PolyNorm::check(const TensorView& y, const TensorView& x, const TensorView& w,
                     const TensorView& b, double eps) {
  expect_row_tensor(name, "x", x);
  check_param(name, "w", w, 3, x);
  check_param(name, "b", b, 1, x);
  norm_check_like_x(name, "y", y, x);
  expect_finite_scalar(name, "eps", eps, 0.0);
  expect_no_overlap(name, "y", y, "x", x, Aliasing::exact);
  expect_no_overlap(name, "y", y, "w", w);
  expect_no_overlap(name, "y", y, "b", b);
}

void PolyNormBackward::check(const TensorView& dx, const TensorView& dw, const TensorView& db,
                             const TensorView& dy, const TensorView& x, const TensorView& w,
                             double eps) {
  expect_row_tensor(name, "x", x);
  check_param(name, "w", w, 3, x);
  norm_check_like_x(name, "dy", dy, x);
  norm_check_like_x(name, "dx", dx, x);
  check_param(name, "dw", dw, 3, x);
  check_param(name, "db", db, 1, x);
  expect_finite_scalar(name, "eps", eps, 0.0);
  const std::pair<const char*, const TensorView*> inputs[] = {{"dy", &dy}, {"x", &x}, {"w", &w}};
  for (const auto& [arg, t] : inputs) {
    expect_no_overlap(name, "dx", dx, arg, *t);
    expect_no_overlap(name, "dw", dw, arg, *t);
    expect_no_overlap(name, "db", db, arg, *t);
  }
  expect_no_overlap(name, "dw", dw, "dx", dx);
  expect_no_overlap(name, "db", db, "dx", dx);
  expect_no_overlap(name, "db", db, "dw", dw);
}

// ---- Gemma kernels: rms_norm's with offset = 1 ---------------------------------------------------
namespace {

void gemma_rms_norm_reference(const Context& ctx, const TensorView& y, const TensorView& x,
                              const TensorView& w, double eps) {
  rms_norm_reference(ctx, y, x, w, eps, 1.0);
}
void gemma_rms_norm_cpu(const Context& ctx, const TensorView& y, const TensorView& x,
                        const TensorView& w, double eps) {
  rms_norm_cpu(ctx, y, x, w, eps, 1.0);
}
const char* gemma_rms_norm_cpu_applicable(const TensorView& y, const TensorView& x,
                                          const TensorView& w, double eps) {
  return rms_norm_cpu_applicable(y, x, w, eps, 1.0);
}

void gemma_rms_norm_backward_reference(const Context& ctx, const TensorView& dx,
                                       const TensorView& dw, const TensorView& dy,
                                       const TensorView& x, const TensorView& w, double eps) {
  rms_norm_backward_reference(ctx, dx, dw, dy, x, w, eps, 1.0);
}
void gemma_rms_norm_backward_cpu(const Context& ctx, const TensorView& dx, const TensorView& dw,
                                 const TensorView& dy, const TensorView& x, const TensorView& w,
                                 double eps) {
  rms_norm_backward_cpu(ctx, dx, dw, dy, x, w, eps, 1.0);
}
const char* gemma_rms_norm_backward_cpu_applicable(const TensorView& dx, const TensorView& dw,
                                                   const TensorView& dy, const TensorView& x,
                                                   const TensorView& w, double eps) {
  return rms_norm_backward_cpu_applicable(dx, dw, dy, x, w, eps, 1.0);
}

void gemma_fused_add_rms_norm_reference(const Context& ctx, const TensorView& y,
                                        const TensorView& s, const TensorView& x,
                                        const TensorView& residual, const TensorView& w,
                                        double eps) {
  fused_add_rms_norm_reference(ctx, y, s, x, residual, w, eps, 1.0);
}
void gemma_fused_add_rms_norm_cpu(const Context& ctx, const TensorView& y, const TensorView& s,
                                  const TensorView& x, const TensorView& residual,
                                  const TensorView& w, double eps) {
  fused_add_rms_norm_cpu(ctx, y, s, x, residual, w, eps, 1.0);
}
const char* gemma_fused_add_rms_norm_cpu_applicable(const TensorView& y, const TensorView& s,
                                                    const TensorView& x,
                                                    const TensorView& residual,
                                                    const TensorView& w, double eps) {
  return fused_add_rms_norm_cpu_applicable(y, s, x, residual, w, eps, 1.0);
}

void gemma_fused_add_rms_norm_backward_reference(
    const Context& ctx, const TensorView& dx, const TensorView& dresidual, const TensorView& dw,
    const TensorView& dy, const TensorView& ds, const TensorView& x, const TensorView& residual,
    const TensorView& w, double eps) {
  fused_add_rms_norm_backward_reference(ctx, dx, dresidual, dw, dy, ds, x, residual, w, eps, 1.0);
}
void gemma_fused_add_rms_norm_backward_cpu(const Context& ctx, const TensorView& dx,
                                           const TensorView& dresidual, const TensorView& dw,
                                           const TensorView& dy, const TensorView& ds,
                                           const TensorView& x, const TensorView& residual,
                                           const TensorView& w, double eps) {
  fused_add_rms_norm_backward_cpu(ctx, dx, dresidual, dw, dy, ds, x, residual, w, eps, 1.0);
}
const char* gemma_fused_add_rms_norm_backward_cpu_applicable(
    const TensorView& dx, const TensorView& dresidual, const TensorView& dw, const TensorView& dy,
    const TensorView& ds, const TensorView& x, const TensorView& residual, const TensorView& w,
    double eps) {
  return fused_add_rms_norm_backward_cpu_applicable(dx, dresidual, dw, dy, ds, x, residual, w,
                                                    eps, 1.0);
}

// ---- registration --------------------------------------------------------------------------------
KernelDesc reference_desc(bool in_place) {
  return reference_kernel_desc("plain loops, double accumulation, one rounding per output", in_place);
}

std::vector<OutputSpec> like_x(const ArgList& a, std::initializer_list<const char*> names) {
  const TensorView& x = a.tensor("x");
  std::vector<OutputSpec> out;
  for (const char* n : names) out.push_back({n, x.shape_of(), x.dtype});
  return out;
}

// Flops per element as rms_norm's (norm.cpp): forward 5, backward 12.
void register_gemma(Registry& reg) {
  {
    OpEntry& op = reg.add_op<GemmaRmsNorm>();
    op.outputs = [](const ArgList& a) { return like_x(a, {"y"}); };
    op.cost = [](const ArgList& a) {
      const TensorView &x = a.tensor("x"), &w = a.tensor("w");
      return Cost{2 * bytes_of(x) + bytes_of(w), 5 * double(x.numel())};
    };
    op.cases = gemma_rms_norm_cases;
    reg.add_kernel<GemmaRmsNorm>(reference_desc(true), &gemma_rms_norm_reference);
    reg.add_kernel<GemmaRmsNorm>(cpu_kernel_desc("rms_norm's cpu kernel with offset 1", true),
                                 &gemma_rms_norm_cpu, &gemma_rms_norm_cpu_applicable);
  }
  {
    OpEntry& op = reg.add_op<GemmaRmsNormBackward>();
    op.outputs = [](const ArgList& a) {
      std::vector<OutputSpec> out = like_x(a, {"dx"});
      out.push_back({"dw", a.tensor("w").shape_of(), a.tensor("w").dtype});
      return out;
    };
    op.cost = [](const ArgList& a) {
      const TensorView &x = a.tensor("x"), &w = a.tensor("w");
      return Cost{3 * bytes_of(x) + 2 * bytes_of(w), 12 * double(x.numel())};
    };
    op.cases = gemma_rms_norm_backward_cases;
    reg.add_kernel<GemmaRmsNormBackward>(reference_desc(false), &gemma_rms_norm_backward_reference);
    reg.add_kernel<GemmaRmsNormBackward>(
        with_f32_dw_tolerance(cpu_kernel_desc("rms_norm_backward's cpu kernel with offset 1")),
        &gemma_rms_norm_backward_cpu, &gemma_rms_norm_backward_cpu_applicable);
  }
  {
    OpEntry& op = reg.add_op<GemmaFusedAddRmsNorm>();
    op.outputs = [](const ArgList& a) { return like_x(a, {"y", "s"}); };
    op.cost = [](const ArgList& a) {
      const TensorView &x = a.tensor("x"), &w = a.tensor("w");
      return Cost{4 * bytes_of(x) + bytes_of(w), 6 * double(x.numel())};
    };
    op.cases = gemma_fused_add_rms_norm_cases;
    reg.add_kernel<GemmaFusedAddRmsNorm>(reference_desc(true), &gemma_fused_add_rms_norm_reference);
    reg.add_kernel<GemmaFusedAddRmsNorm>(
        cpu_kernel_desc("fused_add_rms_norm's cpu kernel with offset 1", true),
        &gemma_fused_add_rms_norm_cpu, &gemma_fused_add_rms_norm_cpu_applicable);
  }
  {
    OpEntry& op = reg.add_op<GemmaFusedAddRmsNormBackward>();
    op.outputs = [](const ArgList& a) {
      std::vector<OutputSpec> out = like_x(a, {"dx", "dresidual"});
      out.push_back({"dw", a.tensor("w").shape_of(), a.tensor("w").dtype});
      return out;
    };
    op.cost = [](const ArgList& a) {
      const TensorView &x = a.tensor("x"), &w = a.tensor("w");
      return Cost{6 * bytes_of(x) + 2 * bytes_of(w), 14 * double(x.numel())};
    };
    op.cases = gemma_fused_add_rms_norm_backward_cases;
    reg.add_kernel<GemmaFusedAddRmsNormBackward>(reference_desc(false),
                                                 &gemma_fused_add_rms_norm_backward_reference);
    reg.add_kernel<GemmaFusedAddRmsNormBackward>(
        with_f32_dw_tolerance(
            cpu_kernel_desc("fused_add_rms_norm_backward's cpu kernel with offset 1")),
        &gemma_fused_add_rms_norm_backward_cpu, &gemma_fused_add_rms_norm_backward_cpu_applicable);
  }
}

// Flops per element. Gated forward: act 4 (exp, add, divide, multiply), gate multiply 1, sum of
// squares 2, y 3. Backward: act and slope 8, sums 4, du / dx / dz / dw 10.
constexpr double kGatedForwardFlops = 10, kGatedBackwardFlops = 22;
// Poly forward: powers 2, three sums of squares 6, y 7. Backward: powers 4, sums 12, dx 18,
// db 1.
constexpr double kPolyForwardFlops = 15, kPolyBackwardFlops = 35;

void register_gated(Registry& reg) {
  {
    OpEntry& op = reg.add_op<RmsNormGated>();
    op.outputs = [](const ArgList& a) { return like_x(a, {"y"}); };
    op.cost = [](const ArgList& a) {
      const TensorView &x = a.tensor("x"), &w = a.tensor("w");
      return Cost{3 * bytes_of(x) + bytes_of(w), kGatedForwardFlops * double(x.numel())};
    };
    op.cases = rms_norm_gated_cases;
    reg.add_kernel<RmsNormGated>(reference_desc(true), &rms_norm_gated_reference);
    reg.add_kernel<RmsNormGated>(
        cpu_kernel_desc("Highway SIMD + OpenMP over row tasks, gate and norm fused, f32 math", true),
        &rms_norm_gated_cpu, &rms_norm_gated_cpu_applicable);
  }
  {
    OpEntry& op = reg.add_op<RmsNormGatedBackward>();
    op.outputs = [](const ArgList& a) {
      std::vector<OutputSpec> out = like_x(a, {"dx", "dz"});
      out.push_back({"dw", a.tensor("w").shape_of(), a.tensor("w").dtype});
      return out;
    };
    op.cost = [](const ArgList& a) {
      const TensorView &x = a.tensor("x"), &w = a.tensor("w");
      // Reads dy, x, z, w; writes dx, dz, dw.
      return Cost{5 * bytes_of(x) + 2 * bytes_of(w), kGatedBackwardFlops * double(x.numel())};
    };
    op.cases = rms_norm_gated_backward_cases;
    reg.add_kernel<RmsNormGatedBackward>(reference_desc(false), &rms_norm_gated_backward_reference);
    reg.add_kernel<RmsNormGatedBackward>(
        cpu_kernel_desc("Highway SIMD + OpenMP; dw from f32 chunk partials in a fixed order"),
        &rms_norm_gated_backward_cpu, &rms_norm_gated_backward_cpu_applicable);
  }
}

void register_poly(Registry& reg) {
  {
    OpEntry& op = reg.add_op<PolyNorm>();
    op.outputs = [](const ArgList& a) { return like_x(a, {"y"}); };
    op.cost = [](const ArgList& a) {
      const TensorView &x = a.tensor("x"), &w = a.tensor("w"), &b = a.tensor("b");
      return Cost{2 * bytes_of(x) + bytes_of(w) + bytes_of(b), kPolyForwardFlops * double(x.numel())};
    };
    op.cases = poly_norm_cases;
    reg.add_kernel<PolyNorm>(reference_desc(true), &poly_norm_reference);
    reg.add_kernel<PolyNorm>(
        cpu_kernel_desc("Highway SIMD + OpenMP over row tasks, three sums in one pass", true),
        &poly_norm_cpu, &poly_norm_cpu_applicable);
  }
  {
    OpEntry& op = reg.add_op<PolyNormBackward>();
    op.outputs = [](const ArgList& a) {
      std::vector<OutputSpec> out = like_x(a, {"dx"});
      out.push_back({"dw", a.tensor("w").shape_of(), a.tensor("w").dtype});
      out.push_back({"db", Shape{1}, a.tensor("x").dtype});
      return out;
    };
    op.cost = [](const ArgList& a) {
      const TensorView &x = a.tensor("x"), &w = a.tensor("w");
      return Cost{3 * bytes_of(x) + 2 * bytes_of(w) + 2.0 * double(x.itemsize()),
                  kPolyBackwardFlops * double(x.numel())};
    };
    op.cases = poly_norm_backward_cases;
    reg.add_kernel<PolyNormBackward>(reference_desc(false), &poly_norm_backward_reference);
    reg.add_kernel<PolyNormBackward>(
        cpu_kernel_desc("Highway SIMD + OpenMP; dw, db from per-chunk partials in a fixed order"),
        &poly_norm_backward_cpu, &poly_norm_backward_cpu_applicable);
  }
}

}  // namespace

void register_norm_variants(Registry& reg) {
  register_gemma(reg);
  register_gated(reg);
  register_poly(reg);
}

}  // namespace opforge
