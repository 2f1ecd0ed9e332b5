// Activation family: checks, shape functions, cost models and registration (activation.h).
#include <utility>

#include "ops/activation/internal.h"
#include "opforge/checks.h"

namespace opforge {

namespace {

// x: a row tensor whose last dim (2d) splits into the gate half a and the up half b.
void check_gated_input(const char* op, const TensorView& x) {
  expect_row_tensor(op, "x", x);
  expect_even_last_dim(op, "x", x);
}

// x's shape with the last dim halved: the shape of y and dy.
Shape half_shape(const TensorView& x) {
  Shape s = x.shape_of();
  s.dims[size_t(s.ndim - 1)] /= 2;
  return s;
}

// A row tensor of x's dtype and device with the given shape.
void check_row_output(const char* op, const char* arg, const TensorView& t, const TensorView& x,
                      const Shape& shape) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, "x", x);
  expect_shape(op, arg, t, shape);
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, "x", x);
}

}  // namespace

// y ([..., d]) overlaps nothing: no in-place form, as y and x differ in shape.
void SiluAndMul::check(const TensorView& y, const TensorView& x) {
  check_gated_input(name, x);
  check_row_output(name, "y", y, x, half_shape(x));
  expect_no_overlap(name, "y", y, "x", x);
}

// dx overlaps neither input (each element of dx depends on both halves of x).
void SiluAndMulBackward::check(const TensorView& dx, const TensorView& dy, const TensorView& x) {
  check_gated_input(name, x);
  check_row_output(name, "dy", dy, x, half_shape(x));
  check_row_output(name, "dx", dx, x, x.shape_of());
  expect_no_overlap(name, "dx", dx, "dy", dy);
  expect_no_overlap(name, "dx", dx, "x", x);
}

namespace {

KernelDesc reference_desc() {
  return reference_kernel_desc("plain loops, double arithmetic, one rounding per output");
}

// Flops per output element of silu_and_mul: -|a|, exp, 1 + e, divide, select, a * s, * b
// (exp counted as one). Backward per gated pair: sigmoid 5, slope 2, da 2, db 2, dy * s 1.
constexpr double kForwardFlops = 7;
constexpr double kBackwardFlops = 12;

void register_silu_and_mul(Registry& reg) {
  OpEntry& op = reg.add_op<SiluAndMul>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"y", half_shape(x), x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    // Reads x (a and b), writes y (half of x).
    return Cost{1.5 * bytes_of(x), kForwardFlops * double(x.numel()) / 2};
  };
  op.cases = silu_and_mul_cases;
  reg.add_kernel<SiluAndMul>(reference_desc(), &silu_and_mul_reference);
  reg.add_kernel<SiluAndMul>(
      cpu_kernel_desc("Highway SIMD (runtime ISA dispatch) + OpenMP over L1-sized tiles, f32 math"),
      &silu_and_mul_cpu, &silu_and_mul_cpu_applicable);
}

void register_silu_and_mul_backward(Registry& reg) {
  OpEntry& op = reg.add_op<SiluAndMulBackward>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"dx", x.shape_of(), x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    // Reads dy (half of x) and x, writes dx.
    return Cost{2.5 * bytes_of(x), kBackwardFlops * double(x.numel()) / 2};
  };
  op.cases = silu_and_mul_backward_cases;
  reg.add_kernel<SiluAndMulBackward>(reference_desc(), &silu_and_mul_backward_reference);
  reg.add_kernel<SiluAndMulBackward>(
      cpu_kernel_desc("Highway SIMD + OpenMP over L1-sized tiles; sigmoid recomputed from x"),
      &silu_and_mul_backward_cpu, &silu_and_mul_backward_cpu_applicable);
}

}  // namespace

void register_activation(Registry& reg) {
  register_silu_and_mul(reg);
  register_silu_and_mul_backward(reg);
}

}  // namespace opforge
