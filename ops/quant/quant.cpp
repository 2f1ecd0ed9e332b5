// Quant family: checks, shape function, cost model and registration (quant.h).
#include <cmath>
#include <string>

#include "opforge/checks.h"
#include "opforge/error.h"
#include "ops/quant/internal.h"

namespace opforge {

QuantMode parse_quant_mode(std::string_view op, std::string_view mode) {
  if (mode == "per_tensor") return QuantMode::per_tensor;
  if (mode == "per_token") return QuantMode::per_token;
  if (mode == "static") return QuantMode::static_scale;
  throw_argument_error(op, "mode", "one of per_tensor, per_token, static", "'" + std::string(mode) + "'");
}

namespace {

// The scale output's shape: [1], or x's shape with a last dim of 1 per token.
Shape scale_shape(const TensorView& x, QuantMode mode) {
  if (mode != QuantMode::per_token) return Shape{1};
  Shape s = x.shape_of();
  s.dims[size_t(s.ndim - 1)] = 1;
  return s;
}

void check_static_scale(const char* op, const TensorView& static_scale, const TensorView& x,
                        QuantMode mode) {
  if (mode != QuantMode::static_scale) {
    if (static_scale.defined())
      throw_argument_error(op, "static_scale", "none (mode is not 'static')", "a tensor");
    return;
  }
  if (!static_scale.defined()) throw_argument_error(op, "static_scale", "an f32 [1] tensor (mode 'static')", "none");
  expect_dtype(op, "static_scale", static_scale, DType::f32);
  expect_shape(op, "static_scale", static_scale, Shape{1});
  expect_same_device(op, "static_scale", static_scale, "x", x);
  if (static_scale.device.is_cpu()) {
    const float s = *static_cast<const float*>(static_scale.data);
    if (!(std::isfinite(s) && s > 0))
      throw_argument_error(op, "static_scale", "a finite scale > 0", std::to_string(s));
  }
}

}  // namespace

void QuantFp8::check(const TensorView& q, const TensorView& scale, const TensorView& x,
                     const TensorView& static_scale, std::string_view mode, double scale_ub) {
  const QuantMode m = parse_quant_mode(name, mode);
  expect_row_tensor(name, "x", x);
  expect_defined(name, "q", q);
  expect_dtype(name, "q", q, DType::f8e4m3);
  expect_same_shape(name, "q", q, "x", x);
  expect_rows_uniform(name, "q", q);
  expect_same_device(name, "q", q, "x", x);
  expect_defined(name, "scale", scale);
  expect_dtype(name, "scale", scale, DType::f32);
  expect_shape(name, "scale", scale, scale_shape(x, m));
  expect_rows_uniform(name, "scale", scale);
  expect_same_device(name, "scale", scale, "x", x);
  check_static_scale(name, static_scale, x, m);
  expect_finite_scalar(name, "scale_ub", scale_ub, 0.0);
  expect_no_overlap(name, "q", q, "x", x);
  expect_no_overlap(name, "q", q, "scale", scale);
  expect_no_overlap(name, "scale", scale, "x", x);
  if (static_scale.defined()) {
    expect_no_overlap(name, "q", q, "static_scale", static_scale);
    expect_no_overlap(name, "scale", scale, "static_scale", static_scale);
  }
}

void register_quant(Registry& reg) {
  OpEntry& op = reg.add_op<QuantFp8>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    const QuantMode m = parse_quant_mode(QuantFp8::name, a.str("mode"));
    return std::vector<OutputSpec>{{"q", x.shape_of(), DType::f8e4m3},
                                   {"scale", scale_shape(x, m), DType::f32}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &scale = a.tensor("scale");
    // Reads x, writes q (1 byte per element) and the scales; |x|, max and the multiply per element.
    return Cost{bytes_of(x) + double(x.numel()) + bytes_of(scale), 3 * double(x.numel())};
  };
  op.cases = quant_fp8_cases;
  reg.add_kernel<QuantFp8>(
      reference_kernel_desc("plain loops, f32 math as Note [fp8 quantization] prescribes"),
      &quant_fp8_reference);
  reg.add_kernel<QuantFp8>(
      cpu_kernel_desc("Highway SIMD (runtime ISA dispatch) + OpenMP over row tasks, bit-exact"),
      &quant_fp8_cpu, &quant_fp8_cpu_applicable);
}

}  // namespace opforge
