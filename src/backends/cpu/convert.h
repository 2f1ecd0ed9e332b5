// Bulk dtype conversions with the SIMD code the CPU kernels use (Note [vector rounding] in
// backends/cpu/simd-inl.h), and control of Highway's runtime dispatch for tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace opforge::cpu {

// dst[i] = the 16-bit pattern of src[i] rounded to nearest even (Note [rounding]).
void f32_to_bf16_n(const float* src, uint16_t* dst, int64_t n);
void f32_to_f16_n(const float* src, uint16_t* dst, int64_t n);
// dst[i] = src[i] widened exactly.
void bf16_to_f32_n(const uint16_t* src, float* dst, int64_t n);
void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n);

// A SIMD target compiled into opforge that this CPU can run ("AVX2", "AVX3", "SSE4", "NEON"...).
struct SimdTarget {
  int64_t bit = 0;
  std::string name;
};
std::vector<SimdTarget> simd_targets();
// The target the dispatch picks now (the best one unless restricted below).
std::string simd_target_name();
// Restrict the dispatch to one target (a bit of simd_targets()); 0 restores the best target.
// For tests: it changes the whole process and is not thread-safe.
void restrict_simd_target_for_testing(int64_t bit);

}  // namespace opforge::cpu
