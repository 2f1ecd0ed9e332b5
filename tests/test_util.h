// Helpers shared by the op test files: row-layout buffers with padded rows and a sentinel,
// element access, tolerances, and the check that an argument error names its argument.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "opforge/error.h"
#include "opforge/registry.h"
#include "opforge/tensor.h"

namespace opforge::test_util {

inline constexpr unsigned char kSentinel = 0x7b;

// A row-layout tensor whose rows may be padded: storage [rows, hidden + pad], view [shape].
// Storage starts filled with kSentinel bytes, so writes into the padding are visible.
struct Buf {
  Tensor storage;
  TensorView view;
  int64_t pad = 0;
  operator const TensorView&() const { return view; }  // NOLINT
};

inline Buf make(const Shape& shape, DType dtype, int64_t pad = 0) {
  Buf b;
  const int64_t hidden = shape[shape.ndim - 1];
  const int64_t rows = shape.ndim > 1 ? shape.numel() / std::max<int64_t>(hidden, 1) : 1;
  const int64_t row_len = hidden + pad;
  b.storage = Tensor::empty(Shape{std::max<int64_t>(rows * row_len, 1)}, dtype);
  std::memset(b.storage.data(), kSentinel, size_t(b.storage.nbytes()));
  std::vector<int64_t> strides(size_t(shape.ndim), 1);
  if (shape.ndim >= 2) strides[size_t(shape.ndim - 2)] = row_len;
  for (int i = shape.ndim - 3; i >= 0; --i) strides[size_t(i)] = strides[size_t(i + 1)] * shape[i + 1];
  b.view = TensorView(b.storage.data(), dtype, shape, strides);
  b.pad = pad;
  return b;
}

inline int64_t offset_of(const TensorView& t, int64_t row, int64_t i) { return row * t.row_stride() + i; }
inline double get(const TensorView& t, int64_t row, int64_t i) {
  return load_as_double(t.data, t.dtype, offset_of(t, row, i));
}
inline void set(const TensorView& t, int64_t row, int64_t i, double v) {
  store_from_double(t.data, t.dtype, offset_of(t, row, i), v);
}
// Element i of a contiguous tensor.
inline double at(const TensorView& t, int64_t i) { return load_as_double(t.data, t.dtype, i); }

// Padding bytes of `b` still hold the sentinel.
inline void expect_padding_untouched(const Buf& b) {
  if (b.pad == 0) return;
  const auto* bytes = static_cast<const unsigned char*>(b.view.data);
  const int64_t size = b.view.itemsize(), hidden = b.view.size(-1);
  for (int64_t row = 0; row < b.view.rows(); ++row)
    for (int64_t i = hidden; i < hidden + b.pad; ++i)
      for (int64_t k = 0; k < size; ++k)
        ASSERT_EQ(bytes[(row * b.view.row_stride() + i) * size + k], kSentinel) << "row " << row;
}

// Two ulps of the dtype (reference and kernel each round once, from slightly different values);
// `f32` is the tolerance for f32 and f64, which depends on how long the sums are.
inline double rtol_of(DType t, double f32 = 2e-5) {
  switch (t) {
    case DType::bf16: return 1.6e-2;
    case DType::f16: return 2e-3;
    default: return f32;
  }
}

// `call` throws an invalid-argument Error naming argument `arg` (and containing `fragment`).
template <class F>
void expect_arg_error(F&& call, const std::string& arg, const std::string& fragment = "") {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming argument '" << arg << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("argument '" + arg + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg << "\n  lacks: " << fragment;
  }
}

// A contiguous tensor of `shape` holding `values` (the rest zeros), and its elements as doubles.
inline Tensor tensor(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t = Tensor::zeros(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) store_from_double(t.data(), dtype, int64_t(i), values[i]);
  return t;
}
inline std::vector<double> values_of(const TensorView& t) {
  std::vector<double> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_double(t.data, t.dtype, int64_t(i));
  return v;
}
inline std::vector<uint8_t> bytes_of_tensor(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return {p, p + t.nbytes()};
}

// `reg.call(op, args)` throws invalid_argument naming `arg` and leaves every tensor in `watched`
// unchanged.
inline void expect_rejected(const Registry& reg, const std::string& op, const std::vector<Value>& args,
                            const std::string& arg, const std::vector<const Tensor*>& watched) {
  SCOPED_TRACE(op + " / " + arg);
  std::vector<std::vector<uint8_t>> before;
  for (const Tensor* t : watched) before.push_back(bytes_of_tensor(*t));
  expect_arg_error([&] { reg.call(op, args); }, arg);
  for (size_t i = 0; i < watched.size(); ++i) EXPECT_EQ(bytes_of_tensor(*watched[i]), before[i]);
}

}  // namespace opforge::test_util
