// Quant family internals shared by quant.cpp, reference.cpp, cpu.cpp and cases.cpp.
#pragma once

#include <string_view>
#include <vector>

#include "ops/quant/quant.h"

namespace opforge {

enum class QuantMode : uint8_t { per_tensor, per_token, static_scale };
// Error naming 'mode' for anything else.
QuantMode parse_quant_mode(std::string_view op, std::string_view mode);

// Note [fp8 quantization]: the smallest scale.
inline constexpr float kFp8MinScale = 1.0f / (448.0f * 512.0f);
// s from an amax (f32): max(amax / 448, kFp8MinScale).
inline float fp8_scale_of(float amax) {
  const float s = amax / 448.0f;
  return s > kFp8MinScale ? s : kFp8MinScale;
}

// What cpu.cpp's per-target code receives (plain data; strides in elements).
struct QuantRows {
  DType dtype;
  const void* x;
  int64_t x_stride, hidden;
  uint8_t* q;
  int64_t q_stride;
  float* scales;           // per_token: one per row at scales[row * scale_stride]
  int64_t scale_stride;
  float inv;               // per_tensor / static: the common 1 / s
  float scale_ub;          // per_token: 0 for none
};


void quant_fp8_reference(const Context&, const TensorView& q, const TensorView& scale,
                         const TensorView& x, const TensorView& static_scale,
                         std::string_view mode, double scale_ub);
void quant_fp8_cpu(const Context&, const TensorView& q, const TensorView& scale,
                   const TensorView& x, const TensorView& static_scale, std::string_view mode,
                   double scale_ub);
const char* quant_fp8_cpu_applicable(const TensorView& q, const TensorView& scale,
                                     const TensorView& x, const TensorView& static_scale,
                                     std::string_view mode, double scale_ub);

std::vector<Case> quant_fp8_cases();

// cpu.cpp: the vector f32 -> f8e4m3 conversion of the best target this machine runs (tests
// compare it with the scalar f32_to_f8e4m3).
void f32_to_f8e4m3_simd(const float* in, uint8_t* out, int64_t n);

}  // namespace opforge
