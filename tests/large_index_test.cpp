// 64-bit indexing on the CPU: a row-wise op (rms_norm) and a gated pointwise op (silu_and_mul) on
// tensors of more than 2^31 elements, through the slot the policy binds to the `cpu` kernel. The
// last rows (whose element offsets do not fit in int32) are compared with values computed here in
// double from the same inputs; a kernel that indexed with 32-bit integers would read or write the
// wrong rows, or fault.
//
// Each tensor is 4+ GiB (bf16), so the whole test needs about 7 GiB of memory at its peak.
#include <gtest/gtest.h>


#include <cmath>
#include <cstdint>
#include <cstring>

#include "opforge/policy.h"
#include "opforge/slot.h"
#include "ops/activation/activation.h"
#include "ops/norm/norm.h"
#include "tests/test_util.h"

namespace opforge {
namespace {

using test_util::at;

constexpr int64_t kTwo31 = int64_t(1) << 31;

// A value that depends on the row and the column, so rows that alias modulo 2^31 or 2^32 differ.
double pattern(int64_t row, int64_t col) { return double((row * 7 + col * 3) % 29 - 14) / 8.0; }

// pattern(row, .) depends on row % 29 only: build the 29 distinct rows once, then copy them.
void fill_all(const TensorView& t, int64_t rows, int64_t width) {
  const int64_t item = t.itemsize();
  Tensor templates = Tensor::empty(Shape{29, width}, t.dtype);
  for (int64_t r = 0; r < 29; ++r)
    for (int64_t j = 0; j < width; ++j) store_from_double(templates.data(), t.dtype, r * width + j, pattern(r, j));
  auto* dst = static_cast<uint8_t*>(t.data);
  const auto* src = static_cast<const uint8_t*>(templates.data());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * width * item, src + (r % 29) * width * item, size_t(width * item));
}

TEST(LargeIndex, RmsNormRowsPastTwoTo31Elements) {
  const int64_t hidden = 4096;
  const int64_t rows = kTwo31 / hidden + 3;  // 2^31 + 3 * 4096 elements
  ASSERT_GT(rows * hidden, kTwo31);
  Tensor x = Tensor::empty(Shape{rows, hidden}, DType::bf16);
  Tensor w = Tensor::empty(Shape{hidden}, DType::bf16);
  fill_all(x.view(), rows, hidden);
  for (int64_t j = 0; j < hidden; ++j) store_from_double(w.data(), DType::bf16, j, 0.75 + double(j % 5) / 8);
  Tensor y = Tensor::empty(Shape{rows, hidden}, DType::bf16);
  std::memset(static_cast<uint8_t*>(y.data()) + (rows - 4) * hidden * 2, 0xff, size_t(4 * hidden * 2));

  auto slot = bind<RmsNorm>(Policy::parse("rms_norm=cpu,strict"), Device::cpu());
  slot(y.view(), x.view(), w.view(), 1e-6, 0.0);

  for (int64_t r = rows - 4; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < hidden; ++j) ss += at(x.view(), r * hidden + j) * at(x.view(), r * hidden + j);
    const double inv = 1.0 / std::sqrt(ss / double(hidden) + 1e-6);
    for (int64_t j = 0; j < hidden; ++j) {
      const double want = at(x.view(), r * hidden + j) * inv * at(w.view(), j);
      const double got = at(y.view(), r * hidden + j);
      ASSERT_NEAR(got, want, 1e-2 * std::fabs(want) + 1e-3) << "row " << r << " col " << j;
    }
  }
}

TEST(LargeIndex, SiluAndMulRowsPastTwoTo31Elements) {
  const int64_t d = 4096;
  const int64_t rows = kTwo31 / (2 * d) + 2;  // x has 2^31 + 4 * 4096 elements
  ASSERT_GT(rows * 2 * d, kTwo31);
  Tensor x = Tensor::empty(Shape{rows, 2 * d}, DType::bf16);
  fill_all(x.view(), rows, 2 * d);
  Tensor y = Tensor::empty(Shape{rows, d}, DType::bf16);
  std::memset(static_cast<uint8_t*>(y.data()) + (rows - 3) * d * 2, 0xff, size_t(3 * d * 2));  // NaN

  auto slot = bind<SiluAndMul>(Policy::parse("silu_and_mul=cpu,strict"), Device::cpu());
  slot(y.view(), x.view());

  for (int64_t r = rows - 3; r < rows; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      const double a = at(x.view(), r * 2 * d + j), b = at(x.view(), r * 2 * d + d + j);
      const double want = a / (1 + std::exp(-a)) * b;
      const double got = at(y.view(), r * d + j);
      ASSERT_NEAR(got, want, 1e-2 * std::fabs(want) + 1e-3) << "row " << r << " col " << j;
    }
  }
}

}  // namespace
}  // namespace opforge
