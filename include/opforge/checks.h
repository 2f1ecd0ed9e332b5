// Argument checks shared by every op's `check`.
//
// Each helper either returns or throws opforge::Error through throw_argument_error, so a message
// always reads "<op>: argument '<arg>': expected <what>, got <what>", e.g.
//   rms_norm: argument 'w': expected shape [4096], got [4095]
// Checks only read the views they are given; an op's `check` runs all of them before any kernel
// writes anything, so a rejected call leaves every output untouched.
#pragma once

#include <cstdint>
#include <string_view>

#include "opforge/dtype.h"
#include "opforge/tensor.h"

namespace opforge {

// `t` is a tensor, not None.
void expect_defined(std::string_view op, std::string_view arg, const TensorView& t);

// One of f32, f64, f16, bf16.
void expect_floating(std::string_view op, std::string_view arg, const TensorView& t);

// Exactly `dtype`.
void expect_dtype(std::string_view op, std::string_view arg, const TensorView& t, DType dtype);

// Same dtype as the reference argument `ref` (named `ref_arg` in the message).
void expect_same_dtype(std::string_view op, std::string_view arg, const TensorView& t,
                       std::string_view ref_arg, const TensorView& ref);

// At least `min_ndim` dimensions.
void expect_min_ndim(std::string_view op, std::string_view arg, const TensorView& t, int min_ndim);

// Exactly `shape`.
void expect_shape(std::string_view op, std::string_view arg, const TensorView& t,
                  const Shape& shape);

// Same shape as the reference argument.
void expect_same_shape(std::string_view op, std::string_view arg, const TensorView& t,
                       std::string_view ref_arg, const TensorView& ref);

// The last dim equals `size` (t has at least one dim).
void expect_last_dim(std::string_view op, std::string_view arg, const TensorView& t, int64_t size);

// The last dim is even (gated activations split it in two halves).
void expect_even_last_dim(std::string_view op, std::string_view arg, const TensorView& t);

// Note [row layout] (ops/norm/norm.h): last dim of stride 1, rows walkable with one row stride.
void expect_rows_uniform(std::string_view op, std::string_view arg, const TensorView& t);

// Same device as the reference argument.
void expect_same_device(std::string_view op, std::string_view arg, const TensorView& t,
                        std::string_view ref_arg, const TensorView& ref);

// How an output may share memory with another argument.
enum class Aliasing : uint8_t {
  none,   // no byte in common
  exact,  // no byte in common, or exactly the same view (same_view): in-place use
};

// `out` must not overlap `other` except as `allowed` says. An exact alias of a view whose byte
// span is empty counts as no overlap.
void expect_no_overlap(std::string_view op, std::string_view out_arg, const TensorView& out,
                       std::string_view other_arg, const TensorView& other,
                       Aliasing allowed = Aliasing::none);

// A finite scalar, not below `min_value` (pass -infinity for no bound; the default).
void expect_finite_scalar(std::string_view op, std::string_view arg, double value);
void expect_finite_scalar(std::string_view op, std::string_view arg, double value,
                          double min_value);

// The usual input of a row-wise op: defined, floating, at least 1 dim, Note [row layout].
void expect_row_tensor(std::string_view op, std::string_view arg, const TensorView& t);

}  // namespace opforge
