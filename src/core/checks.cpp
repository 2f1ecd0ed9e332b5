#include "opforge/checks.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "opforge/error.h"

namespace opforge {

namespace {

std::string layout_str(const TensorView& t) {
  std::string s = std::string(dtype_name(t.dtype)) + t.shape_of().str() + " strides (";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.strides[size_t(i)]);
  return s + ")";
}

std::string number_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

}  // namespace

void expect_defined(std::string_view op, std::string_view arg, const TensorView& t) {
  if (!t.defined()) throw_argument_error(op, arg, "a tensor", "none");
}

void expect_floating(std::string_view op, std::string_view arg, const TensorView& t) {
  if (!is_floating(t.dtype))
    throw_argument_error(op, arg, "a floating dtype (f32, f64, f16, bf16)", dtype_name(t.dtype));
}

void expect_dtype(std::string_view op, std::string_view arg, const TensorView& t, DType dtype) {
  if (t.dtype != dtype)
    throw_argument_error(op, arg, std::string("dtype ") + dtype_name(dtype), dtype_name(t.dtype));
}

void expect_same_dtype(std::string_view op, std::string_view arg, const TensorView& t,
                       std::string_view ref_arg, const TensorView& ref) {
  if (t.dtype != ref.dtype)
    throw_argument_error(op, arg,
                         std::string("dtype ") + dtype_name(ref.dtype) + " (the dtype of " +
                             quoted(ref_arg) + ")",
                         dtype_name(t.dtype));
}

void expect_min_ndim(std::string_view op, std::string_view arg, const TensorView& t, int min_ndim) {
  if (t.ndim < min_ndim)
    throw_argument_error(op, arg, "at least " + std::to_string(min_ndim) + " dim(s)",
                         std::to_string(t.ndim) + " dim(s) " + t.shape_of().str());
}

void expect_shape(std::string_view op, std::string_view arg, const TensorView& t,
                  const Shape& shape) {
  if (!(t.shape_of() == shape))
    throw_argument_error(op, arg, "shape " + shape.str(), t.shape_of().str());
}

void expect_same_shape(std::string_view op, std::string_view arg, const TensorView& t,
                       std::string_view ref_arg, const TensorView& ref) {
  if (!(t.shape_of() == ref.shape_of()))
    throw_argument_error(op, arg,
                         "shape " + ref.shape_of().str() + " (the shape of " + quoted(ref_arg) + ")",
                         t.shape_of().str());
}

void expect_last_dim(std::string_view op, std::string_view arg, const TensorView& t, int64_t size) {
  expect_min_ndim(op, arg, t, 1);
  if (t.size(-1) != size)
    throw_argument_error(op, arg, "last dim " + std::to_string(size),
                         std::to_string(t.size(-1)) + " (shape " + t.shape_of().str() + ")");
}

void expect_even_last_dim(std::string_view op, std::string_view arg, const TensorView& t) {
  expect_min_ndim(op, arg, t, 1);
  if (t.size(-1) % 2 != 0)
    throw_argument_error(op, arg, "an even last dim",
                         std::to_string(t.size(-1)) + " (shape " + t.shape_of().str() + ")");
}

void expect_rows_uniform(std::string_view op, std::string_view arg, const TensorView& t) {
  if (!t.rows_are_uniform())
    throw_argument_error(op, arg,
                         "rows with a unit-stride last dim and one uniform row stride "
                         "(Note [row layout])",
                         layout_str(t));
}

void expect_same_device(std::string_view op, std::string_view arg, const TensorView& t,
                        std::string_view ref_arg, const TensorView& ref) {
  if (!(t.device == ref.device))
    throw_argument_error(op, arg,
                         "device " + ref.device.str() + " (the device of " + quoted(ref_arg) + ")",
                         t.device.str());
}

void expect_no_overlap(std::string_view op, std::string_view out_arg, const TensorView& out,
                       std::string_view other_arg, const TensorView& other, Aliasing allowed) {
  if (!overlaps(out, other)) return;
  if (allowed == Aliasing::exact) {
    if (same_view(out, other)) return;
    throw_argument_error(op, out_arg,
                         "no overlap with " + quoted(other_arg) + " or exactly the same view",
                         "a partial overlap (" + layout_str(out) + " vs " + layout_str(other) +
                             ")");
  }
  throw_argument_error(op, out_arg, "no overlap with " + quoted(other_arg),
                       same_view(out, other) ? std::string("the same memory (in place is not "
                                                           "supported for this pair)")
                                             : std::string("an overlap"));
}

void expect_finite_scalar(std::string_view op, std::string_view arg, double value) {
  if (!std::isfinite(value)) throw_argument_error(op, arg, "a finite value", number_str(value));
}

void expect_finite_scalar(std::string_view op, std::string_view arg, double value,
                          double min_value) {
  if (!std::isfinite(value) || value < min_value)
    throw_argument_error(op, arg, "a finite value >= " + number_str(min_value), number_str(value));
}

void expect_row_tensor(std::string_view op, std::string_view arg, const TensorView& t) {
  expect_defined(op, arg, t);
  expect_floating(op, arg, t);
  expect_min_ndim(op, arg, t, 1);
  expect_rows_uniform(op, arg, t);
}

}  // namespace opforge
