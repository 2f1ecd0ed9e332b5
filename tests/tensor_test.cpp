// Shape, TensorView and Tensor basics (include/opforge/tensor.h): contiguity, the row layout
// kernels rely on (Note [row layout] in ops/norm/norm.h), byte spans, aliasing predicates and
// copy_into with dtype conversion and strides.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "opforge/error.h"
#include "opforge/tensor.h"

namespace opforge {
namespace {

TensorView strided(void* data, DType dtype, const Shape& shape, std::vector<int64_t> strides) {
  return TensorView(data, dtype, shape, std::span<const int64_t>(strides));
}

float g_buffer[256];

// ---- Shape -----------------------------------------------------------------------------------
TEST(Shape, BasicsAndValidation) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim, 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(s.vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(s == Shape({2, 3, 4}));
  EXPECT_FALSE(s == Shape({2, 3}));
  EXPECT_FALSE(s == Shape({2, 3, 5}));
  EXPECT_EQ(Shape{}.numel(), 1);  // a 0-d tensor holds one element
  EXPECT_EQ(Shape({0, 7}).numel(), 0);
  EXPECT_THROW(Shape({2, -1}), Error);
  EXPECT_THROW(Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);  // rank 9 > kMaxDims
}

// ---- TensorView layout -------------------------------------------------------------------------
TEST(TensorView, NoneView) {
  TensorView none;
  EXPECT_FALSE(none.defined());
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.str(), "none");
  EXPECT_FALSE(overlaps(none, TensorView(g_buffer, DType::f32, {4})));
}

TEST(TensorView, ContiguousView) {
  TensorView v(g_buffer, DType::f32, {2, 3, 4});
  EXPECT_TRUE(v.defined());
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(-1), 1);
  EXPECT_EQ(v.size(-1), 4);
  EXPECT_EQ(v.itemsize(), 4);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_TRUE(v.rows_are_uniform());
  EXPECT_EQ(v.rows(), 6);
  EXPECT_EQ(v.row_stride(), 4);
  EXPECT_EQ(v.str(), "f32[2, 3, 4] cpu");
  EXPECT_EQ(v.shape_of(), Shape({2, 3, 4}));
}

TEST(TensorView, PaddedRowsAreUniformButNotContiguous) {
  TensorView v = strided(g_buffer, DType::bf16, {3, 4}, {5, 1});
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_TRUE(v.rows_are_uniform());
  EXPECT_EQ(v.row_stride(), 5);
  EXPECT_EQ(v.rows(), 3);
  // 3-D with padded rows whose batches nest exactly: still one row stride.
  TensorView nested = strided(g_buffer, DType::f32, {2, 3, 4}, {15, 5, 1});
  EXPECT_TRUE(nested.rows_are_uniform());
  EXPECT_EQ(nested.row_stride(), 5);
  EXPECT_EQ(nested.rows(), 6);
  // Padding between batches: rows cannot be walked with one stride.
  TensorView gapped = strided(g_buffer, DType::f32, {2, 3, 4}, {20, 5, 1});
  EXPECT_FALSE(gapped.rows_are_uniform());
  EXPECT_FALSE(gapped.is_contiguous());
}

TEST(TensorView, TransposedAndSizeOneDims) {
  TensorView transposed = strided(g_buffer, DType::f32, {4, 3}, {1, 4});
  EXPECT_FALSE(transposed.is_contiguous());
  EXPECT_FALSE(transposed.rows_are_uniform());  // last dim not unit-stride
  // Strides of size-1 dims do not matter.
  TensorView one_row = strided(g_buffer, DType::f32, {1, 4}, {100, 1});
  EXPECT_TRUE(one_row.is_contiguous());
  EXPECT_TRUE(one_row.rows_are_uniform());
  TensorView column = strided(g_buffer, DType::f32, {4, 1}, {1, 7});
  EXPECT_TRUE(column.is_contiguous());
  EXPECT_TRUE(column.rows_are_uniform());
  EXPECT_EQ(column.row_stride(), 1);
}

TEST(TensorView, OneDZeroDAndEmpty) {
  TensorView one(g_buffer, DType::f32, {7});
  EXPECT_EQ(one.rows(), 1);
  EXPECT_TRUE(one.rows_are_uniform());
  TensorView scalar(g_buffer, DType::f64, Shape{});
  EXPECT_EQ(scalar.ndim, 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.is_contiguous());
  TensorView empty(g_buffer, DType::f32, {0, 4});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.rows(), 0);
  auto [b, e] = empty.byte_span();
  EXPECT_EQ(b, e);
}

TEST(TensorView, ByteSpans) {
  const char* base = reinterpret_cast<const char*>(g_buffer);
  TensorView v(g_buffer, DType::f32, {2, 3});
  EXPECT_EQ(v.byte_span().first, base);
  EXPECT_EQ(v.byte_span().second, base + 24);
  TensorView padded = strided(g_buffer, DType::f32, {3, 4}, {5, 1});
  EXPECT_EQ(padded.byte_span().second, base + (2 * 5 + 3 + 1) * 4);
  // A reversed view: data points at the last element of the buffer it walks backwards.
  TensorView reversed = strided(g_buffer + 3, DType::f32, {4}, {-1});
  EXPECT_EQ(reversed.byte_span().first, base);
  EXPECT_EQ(reversed.byte_span().second, base + 16);
}

// ---- aliasing predicates ----------------------------------------------------------------------
TEST(TensorView, Overlaps) {
  TensorView first_half(g_buffer, DType::f32, {2, 4});
  TensorView second_half(g_buffer + 8, DType::f32, {2, 4});
  TensorView middle(g_buffer + 6, DType::f32, {4});
  EXPECT_FALSE(overlaps(first_half, second_half));
  EXPECT_TRUE(overlaps(first_half, middle));
  EXPECT_TRUE(overlaps(second_half, middle));
  EXPECT_TRUE(overlaps(first_half, first_half));
  // Byte spans, not elements: interleaved columns count as overlapping (conservative).
  TensorView even = strided(g_buffer, DType::f32, {4}, {2});
  TensorView odd = strided(g_buffer + 1, DType::f32, {4}, {2});
  EXPECT_TRUE(overlaps(even, odd));
  // Empty views and views on other devices never overlap.
  EXPECT_FALSE(overlaps(first_half, TensorView(g_buffer, DType::f32, {0})));
  EXPECT_FALSE(overlaps(first_half, TensorView(g_buffer, DType::f32, {2, 4}, Device::cuda(0))));
  // Adjacent but not touching: [0, 16) and [16, 32).
  EXPECT_FALSE(overlaps(TensorView(g_buffer, DType::f32, {4}), TensorView(g_buffer + 4, DType::f32, {4})));
}

TEST(TensorView, SameView) {
  TensorView a(g_buffer, DType::f32, {2, 4});
  EXPECT_TRUE(same_view(a, TensorView(g_buffer, DType::f32, {2, 4})));
  EXPECT_FALSE(same_view(a, TensorView(g_buffer, DType::i32, {2, 4})));
  EXPECT_FALSE(same_view(a, TensorView(g_buffer, DType::f32, {4, 2})));
  EXPECT_FALSE(same_view(a, TensorView(g_buffer + 1, DType::f32, {2, 4})));
  EXPECT_FALSE(same_view(a, strided(g_buffer, DType::f32, {2, 4}, {5, 1})));
  EXPECT_FALSE(same_view(a, TensorView(g_buffer, DType::f32, {2, 4}, Device::cuda(0))));
}

// ---- Tensor and copies -------------------------------------------------------------------------
TEST(Tensor, EmptyZerosAndAlignment) {
  Tensor t = Tensor::empty({3, 5}, DType::bf16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.nbytes(), 30);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  EXPECT_TRUE(t.view().is_contiguous());
  Tensor z = Tensor::zeros({4, 3}, DType::f64);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(z.ptr<double>()[i], 0.0);
  Tensor none = Tensor::empty({0}, DType::f32);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, CopyIntoConvertsDtypesThroughStrides) {
  Tensor src = Tensor::empty({3, 4}, DType::f32);
  for (int i = 0; i < 12; ++i) src.ptr<float>()[i] = float(i) + 0.25f;
  // Destination: bf16 rows of 4 padded to a stride of 6.
  std::vector<uint16_t> storage(18, 0xffff);
  TensorView dst = strided(storage.data(), DType::bf16, {3, 4}, {6, 1});
  copy_into(dst, src);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(bf16_to_f32(storage[size_t(r * 6 + c)]), float(r * 4 + c) + 0.25f);
    EXPECT_EQ(storage[size_t(r * 6 + 4)], 0xffff) << "padding written";
    EXPECT_EQ(storage[size_t(r * 6 + 5)], 0xffff) << "padding written";
  }
  // Back from the strided bf16 view into contiguous f64.
  Tensor wide = Tensor::copy_of(dst, Device::cpu(), DType::f64);
  EXPECT_TRUE(wide.view().is_contiguous());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(wide.ptr<double>()[i], double(i) + 0.25);
  // A transposed source into a contiguous destination.
  TensorView transposed = strided(src.data(), DType::f32, {4, 3}, {1, 4});
  Tensor t = Tensor::copy_of(transposed, Device::cpu(), DType::f32);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(t.ptr<float>()[r * 3 + c], float(c * 4 + r) + 0.25f);
}

TEST(Tensor, CopyIntoIntegerAndSameDtypeRules) {
  Tensor src = Tensor::empty({4}, DType::f32);
  const float values[4] = {-2.75f, 2.75f, 1e20f, std::numeric_limits<float>::quiet_NaN()};
  std::memcpy(src.data(), values, sizeof values);
  Tensor ints = Tensor::copy_of(src, Device::cpu(), DType::i32);
  EXPECT_EQ(ints.ptr<int32_t>()[0], -2);  // truncation toward zero
  EXPECT_EQ(ints.ptr<int32_t>()[1], 2);
  EXPECT_EQ(ints.ptr<int32_t>()[2], std::numeric_limits<int32_t>::max());  // saturation
  EXPECT_EQ(ints.ptr<int32_t>()[3], 0);                                     // NaN -> 0
  // Same dtype copies are bit-exact, NaN payloads and large i64 included.
  uint32_t payload_nan = 0x7fa12345u;
  std::memcpy(src.ptr<float>() + 3, &payload_nan, 4);
  std::vector<float> out(8, 0.0f);
  copy_into(strided(out.data(), DType::f32, {4}, {2}), src);
  uint32_t copied;
  std::memcpy(&copied, &out[6], 4);
  EXPECT_EQ(copied, payload_nan);
  Tensor big = Tensor::empty({1}, DType::i64);
  big.ptr<int64_t>()[0] = (int64_t(1) << 62) + 1;  // not representable in double
  std::vector<int64_t> big_out(2, 0);
  copy_into(strided(big_out.data(), DType::i64, {1}, {2}), big);
  EXPECT_EQ(big_out[0], (int64_t(1) << 62) + 1);
}

TEST(Tensor, CopyIntoRejectsShapeMismatch) {
  Tensor a = Tensor::empty({2, 3}, DType::f32);
  Tensor b = Tensor::empty({3, 2}, DType::f32);
  try {
    copy_into(a, b);
    ADD_FAILURE() << "copied between different shapes";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace opforge
