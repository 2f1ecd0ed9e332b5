// Reference kernel of quant_fp8: plain loops over rows and hidden in the f32 arithmetic that
// Note [fp8 quantization] prescribes (the op is defined in f32, so double would not be "more
// exact": it would be a different function). Rows follow Note [row layout].
#include <cmath>

#include "ops/quant/internal.h"

namespace opforge {

namespace {

float x_at(const TensorView& x, int64_t row, int64_t i) {
  return float(load_as_double(x.data, x.dtype, row * x.row_stride() + i));
}

// max |x| over a row, NaN ignored.
float row_amax(const TensorView& x, int64_t row) {
  float amax = 0;
  for (int64_t i = 0; i < x.size(-1); ++i) {
    const float a = std::fabs(x_at(x, row, i));
    if (a > amax) amax = a;
  }
  return amax;
}

void quantize_row(const TensorView& q, const TensorView& x, int64_t row, float inv) {
  auto* out = static_cast<uint8_t*>(q.data) + row * q.row_stride();
  for (int64_t i = 0; i < x.size(-1); ++i) {
    // A NaN quotient (x NaN, or x infinite over an infinite scale) is the canonical NaN byte
    // 0x7f: the sign of a NaN is not kept by every device's conversions, so it carries nothing.
    const float v = x_at(x, row, i) * inv;
    out[i] = std::isnan(v) ? uint8_t(0x7fu) : f32_to_f8e4m3(v);
  }
}

}  // namespace

void quant_fp8_reference(const Context&, const TensorView& q, const TensorView& scale,
                         const TensorView& x, const TensorView& static_scale,
                         std::string_view mode, double scale_ub) {
  const QuantMode m = parse_quant_mode(QuantFp8::name, mode);
  const int64_t rows = x.rows();
  auto* scales = static_cast<float*>(scale.data);
  if (m == QuantMode::per_token) {
    const int64_t scale_stride = scale.numel() > 1 ? scale.row_stride() : 1;
    for (int64_t row = 0; row < rows; ++row) {
      float amax = row_amax(x, row);
      if (scale_ub > 0 && amax > float(scale_ub)) amax = float(scale_ub);
      const float s = fp8_scale_of(amax);
      scales[row * scale_stride] = s;
      quantize_row(q, x, row, 1.0f / s);
    }
    return;
  }
  float s;
  if (m == QuantMode::static_scale) {
    s = *static_cast<const float*>(static_scale.data);
  } else {
    float amax = 0;
    for (int64_t row = 0; row < rows; ++row) {
      const float a = row_amax(x, row);
      if (a > amax) amax = a;
    }
    s = fp8_scale_of(amax);
  }
  scales[0] = s;
  const float inv = 1.0f / s;
  for (int64_t row = 0; row < rows; ++row) quantize_row(q, x, row, inv);
}

}  // namespace opforge
