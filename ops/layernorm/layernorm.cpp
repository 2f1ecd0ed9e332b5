// Layernorm family: checks, shape functions, cost models and registration (ops/layernorm/layernorm.h).
#include <string>
#include <utility>

#include "ops/layernorm/internal.h"
#include "opforge/checks.h"
#include "opforge/error.h"

namespace opforge {

namespace {

// A [size] parameter vector (w, b, gamma, beta, alpha, or a gradient of one) with x's dtype and
// device.
void check_vector(const char* op, const char* arg, const TensorView& t, const TensorView& x,
                  int64_t size) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, "x", x);
  expect_shape(op, arg, t, Shape{size});
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, "x", x);
}

// A row tensor with x's dtype, shape and device.
void check_like_x(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, "x", x);
  expect_same_shape(op, arg, t, "x", x);
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, "x", x);
}

void check_eps(const char* op, double eps) { expect_finite_scalar(op, "eps", eps, 0.0); }

// Outputs of a backward op overlap no input and no other output.
void check_backward_overlaps(const char* op,
                             std::initializer_list<std::pair<const char*, const TensorView*>> outs,
                             std::initializer_list<std::pair<const char*, const TensorView*>> ins) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    for (const auto& [arg, t] : ins) expect_no_overlap(op, o->first, *o->second, arg, *t);
    for (auto p = outs.begin(); p != o; ++p) expect_no_overlap(op, o->first, *o->second, p->first, *p->second);
  }
}

void expect_contiguous(const char* op, const char* arg, const TensorView& t) {
  if (t.numel() > 0 && !t.is_contiguous()) throw_argument_error(op, arg, "a contiguous tensor", t.str() + " strided");
}

// group_norm's x: [N, C, *] contiguous floating, num_groups >= 1 dividing C.
void check_group_input(const char* op, const TensorView& x, int64_t num_groups) {
  expect_defined(op, "x", x);
  expect_floating(op, "x", x);
  expect_min_ndim(op, "x", x, 2);
  expect_contiguous(op, "x", x);
  const int64_t channels = x.size(1);
  if (num_groups < 1 || channels % num_groups != 0)
    throw_argument_error(op, "num_groups",
                         "a divisor of the channel count " + std::to_string(channels),
                         std::to_string(num_groups));
}

void check_group_like_x(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  check_like_x(op, arg, t, x);
  expect_contiguous(op, arg, t);
}

}  // namespace

// y may alias x exactly (in place); no other overlap of the output with an input.
void LayerNorm::check(const TensorView& y, const TensorView& x, const TensorView& w,
                      const TensorView& b, double eps) {
  expect_row_tensor(name, "x", x);
  check_vector(name, "w", w, x, x.size(-1));
  if (b.defined()) check_vector(name, "b", b, x, x.size(-1));
  check_like_x(name, "y", y, x);
  expect_no_overlap(name, "y", y, "x", x, Aliasing::exact);
  expect_no_overlap(name, "y", y, "w", w);
  if (b.defined()) expect_no_overlap(name, "y", y, "b", b);
  check_eps(name, eps);
}

void LayerNormBackward::check(const TensorView& dx, const TensorView& dw, const TensorView& db,
                              const TensorView& dy, const TensorView& x, const TensorView& w,
                              double eps) {
  expect_row_tensor(name, "x", x);
  check_vector(name, "w", w, x, x.size(-1));
  check_like_x(name, "dy", dy, x);
  check_like_x(name, "dx", dx, x);
  check_vector(name, "dw", dw, x, x.size(-1));
  check_vector(name, "db", db, x, x.size(-1));
  check_backward_overlaps(name, {{"dx", &dx}, {"dw", &dw}, {"db", &db}},
                          {{"dy", &dy}, {"x", &x}, {"w", &w}});
  check_eps(name, eps);
}

void GroupNorm::check(const TensorView& y, const TensorView& x, const TensorView& w,
                      const TensorView& b, int64_t num_groups, double eps) {
  check_group_input(name, x, num_groups);
  check_vector(name, "w", w, x, x.size(1));
  check_vector(name, "b", b, x, x.size(1));
  check_group_like_x(name, "y", y, x);
  expect_no_overlap(name, "y", y, "x", x, Aliasing::exact);
  expect_no_overlap(name, "y", y, "w", w);
  expect_no_overlap(name, "y", y, "b", b);
  check_eps(name, eps);
}

void GroupNormBackward::check(const TensorView& dx, const TensorView& dw, const TensorView& db,
                              const TensorView& dy, const TensorView& x, const TensorView& w,
                              int64_t num_groups, double eps) {
  check_group_input(name, x, num_groups);
  check_vector(name, "w", w, x, x.size(1));
  check_group_like_x(name, "dy", dy, x);
  check_group_like_x(name, "dx", dx, x);
  check_vector(name, "dw", dw, x, x.size(1));
  check_vector(name, "db", db, x, x.size(1));
  check_backward_overlaps(name, {{"dx", &dx}, {"dw", &dw}, {"db", &db}},
                          {{"dy", &dy}, {"x", &x}, {"w", &w}});
  check_eps(name, eps);
}

void Dyt::check(const TensorView& y, const TensorView& x, const TensorView& alpha,
                const TensorView& gamma, const TensorView& beta) {
  expect_row_tensor(name, "x", x);
  check_vector(name, "alpha", alpha, x, 1);
  check_vector(name, "gamma", gamma, x, x.size(-1));
  if (beta.defined()) check_vector(name, "beta", beta, x, x.size(-1));
  check_like_x(name, "y", y, x);
  expect_no_overlap(name, "y", y, "x", x, Aliasing::exact);
  expect_no_overlap(name, "y", y, "alpha", alpha);
  expect_no_overlap(name, "y", y, "gamma", gamma);
  if (beta.defined()) expect_no_overlap(name, "y", y, "beta", beta);
}

void DytBackward::check(const TensorView& dx, const TensorView& dalpha, const TensorView& dgamma,
                        const TensorView& dbeta, const TensorView& dy, const TensorView& x,
                        const TensorView& alpha, const TensorView& gamma) {
  expect_row_tensor(name, "x", x);
  check_vector(name, "alpha", alpha, x, 1);
  check_vector(name, "gamma", gamma, x, x.size(-1));
  check_like_x(name, "dy", dy, x);
  check_like_x(name, "dx", dx, x);
  check_vector(name, "dalpha", dalpha, x, 1);
  check_vector(name, "dgamma", dgamma, x, x.size(-1));
  check_vector(name, "dbeta", dbeta, x, x.size(-1));
  check_backward_overlaps(name,
                          {{"dx", &dx}, {"dalpha", &dalpha}, {"dgamma", &dgamma}, {"dbeta", &dbeta}},
                          {{"dy", &dy}, {"x", &x}, {"alpha", &alpha}, {"gamma", &gamma}});
}

const char* layernorm_cpu_reason(const TensorView& x) {
  if (!x.device.is_cpu()) return "tensors are not on the cpu";
  switch (x.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

namespace {

KernelDesc reference_desc(bool in_place) {
  return reference_kernel_desc("plain loops, double accumulation, one rounding per output", in_place);
}

// Bytes of an optional input: 0 when it is none.
// The backward cpu kernels in f32: the parameter gradients sum up to 16384 rows (group_norm: N x
// positions per channel) of f32 terms, each rounded once (2^-24 relative), so they differ from
// the f64 reference by about sqrt(rows) * 2^-24 * |term|, ~1e-5 at 16384 rows: above the
// default f32 atol. dx is unaffected (its error stays near the default).
KernelDesc cpu_backward_desc(const char* summary) {
  KernelDesc d = cpu_kernel_desc(summary);
  d.tolerances[DType::f32] = Tolerance{1e-4, 1e-4, 1e-10};
  return d;
}

double optional_bytes(const ArgList& a, const char* name) {
  return a.is_none(name) ? 0.0 : bytes_of(a.tensor(name));
}

// Flops per element. Normalisations: sum, centred sum and sum of squares 4, (x - mean) * rstd * w + b
// 4. Backward: four sums 8, dx 5, dw and db partials 3. dyt: tanh counted as one flop, so
// alpha * x, tanh, gamma * t + beta 4; backward 10.
constexpr double kNormForwardFlops = 8, kNormBackwardFlops = 16;
constexpr double kDytForwardFlops = 4, kDytBackwardFlops = 10;

// dx like x; dw and db like w.
std::vector<OutputSpec> backward_outputs(const ArgList& a) {
  const TensorView &x = a.tensor("x"), &w = a.tensor("w");
  return {{"dx", x.shape_of(), x.dtype}, {"dw", w.shape_of(), w.dtype}, {"db", w.shape_of(), w.dtype}};
}

void register_layer_norm(Registry& reg) {
  OpEntry& op = reg.add_op<LayerNorm>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"y", x.shape_of(), x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    return Cost{2 * bytes_of(x) + bytes_of(w) + optional_bytes(a, "b"), kNormForwardFlops * double(x.numel())};
  };
  op.cases = layer_norm_cases;
  reg.add_kernel<LayerNorm>(reference_desc(true), &layer_norm_reference);
  reg.add_kernel<LayerNorm>(
      cpu_kernel_desc("Highway SIMD + OpenMP over row tasks; one read, centred sums from cache, f32", true),
      &layer_norm_cpu, &layer_norm_cpu_applicable);

  OpEntry& bwd = reg.add_op<LayerNormBackward>();
  bwd.outputs = [](const ArgList& a) { return backward_outputs(a); };
  bwd.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    // Reads dy, x, w; writes dx, dw, db.
    return Cost{3 * bytes_of(x) + 3 * bytes_of(w), kNormBackwardFlops * double(x.numel())};
  };
  bwd.cases = layer_norm_backward_cases;
  reg.add_kernel<LayerNormBackward>(reference_desc(false), &layer_norm_backward_reference);
  reg.add_kernel<LayerNormBackward>(
      cpu_backward_desc("Highway SIMD + OpenMP; one read, dw/db from ordered chunk partials"),
      &layer_norm_backward_cpu, &layer_norm_backward_cpu_applicable);
}

void register_group_norm(Registry& reg) {
  OpEntry& op = reg.add_op<GroupNorm>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"y", x.shape_of(), x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w"), &b = a.tensor("b");
    return Cost{2 * bytes_of(x) + bytes_of(w) + bytes_of(b), kNormForwardFlops * double(x.numel())};
  };
  op.cases = group_norm_cases;
  reg.add_kernel<GroupNorm>(reference_desc(true), &group_norm_reference);
  reg.add_kernel<GroupNorm>(
      cpu_kernel_desc("Highway SIMD + OpenMP over (n, group); one read, centred sums from cache, f32", true),
      &group_norm_cpu, &group_norm_cpu_applicable);

  OpEntry& bwd = reg.add_op<GroupNormBackward>();
  bwd.outputs = [](const ArgList& a) { return backward_outputs(a); };
  bwd.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    return Cost{3 * bytes_of(x) + 3 * bytes_of(w), kNormBackwardFlops * double(x.numel())};
  };
  bwd.cases = group_norm_backward_cases;
  reg.add_kernel<GroupNormBackward>(reference_desc(false), &group_norm_backward_reference);
  reg.add_kernel<GroupNormBackward>(
      cpu_backward_desc("Highway SIMD + OpenMP over (n, group); dw/db summed over n in order"),
      &group_norm_backward_cpu, &group_norm_backward_cpu_applicable);
}

void register_dyt(Registry& reg) {
  OpEntry& op = reg.add_op<Dyt>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"y", x.shape_of(), x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &gamma = a.tensor("gamma");
    return Cost{2 * bytes_of(x) + bytes_of(gamma) + optional_bytes(a, "beta") + x.itemsize(),
                kDytForwardFlops * double(x.numel())};
  };
  op.cases = dyt_cases;
  reg.add_kernel<Dyt>(reference_desc(true), &dyt_reference);
  reg.add_kernel<Dyt>(cpu_kernel_desc("Highway SIMD tanh + OpenMP over row tasks, f32", true),
                      &dyt_cpu, &dyt_cpu_applicable);

  OpEntry& bwd = reg.add_op<DytBackward>();
  bwd.outputs = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &gamma = a.tensor("gamma"), &alpha = a.tensor("alpha");
    return std::vector<OutputSpec>{{"dx", x.shape_of(), x.dtype},
                                   {"dalpha", alpha.shape_of(), x.dtype},
                                   {"dgamma", gamma.shape_of(), x.dtype},
                                   {"dbeta", gamma.shape_of(), x.dtype}};
  };
  bwd.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &gamma = a.tensor("gamma");
    // Reads dy, x, gamma, alpha; writes dx, dgamma, dbeta, dalpha.
    return Cost{3 * bytes_of(x) + 3 * bytes_of(gamma) + 2 * x.itemsize(),
                kDytBackwardFlops * double(x.numel())};
  };
  bwd.cases = dyt_backward_cases;
  reg.add_kernel<DytBackward>(reference_desc(false), &dyt_backward_reference);
  reg.add_kernel<DytBackward>(
      cpu_backward_desc("Highway SIMD tanh + OpenMP; dgamma/dbeta/dalpha from ordered chunk partials"),
      &dyt_backward_cpu, &dyt_backward_cpu_applicable);
}

}  // namespace

void register_layernorm(Registry& reg) {
  register_layer_norm(reg);
  register_group_norm(reg);
  register_dyt(reg);
}

}  // namespace opforge
