// Element types and the bit-exact conversions between the 16-bit floats and f32.
//
// Note [rounding]: f32 -> bf16 and f32 -> f16 round to nearest, ties to even, as IEEE 754 and every
// GPU conversion instruction do. NaN stays NaN (quiet bit set, top payload bits kept), infinities stay
// infinities, f16 subnormals are produced and consumed exactly. Widening to f32 is exact for both.
// tests/dtype_test.cpp checks all 65,536 bit patterns of each type.
//
// Note [fp8 e4m3]: f8e4m3 is OCP FP8 E4M3 "fn" (torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7),
// 3 mantissa bits; no infinities; S.1111.111 is NaN; the largest finite value is 448; subnormals
// are m * 2^-9. It is a storage type (quantized outputs), not one kernels compute in, so
// is_floating() is false. f32 -> f8e4m3 rounds to nearest, ties to even, and saturates: every
// |x| >= 448 (infinities included) becomes +-448, as CUDA's satfinite conversion does; NaN stays
// NaN (0x7f with x's sign). tests/dtype_test.cpp checks all 256 patterns and the rounding.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace opforge {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, f8e4m3 };

// u8 doubles as bool (0 / 1), as numpy's '|b1' is one byte.
inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::u8, DType::f8e4m3};

constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::u8: case DType::f8e4m3: return 1;
  }
  return 0;
}
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}
const char* dtype_name(DType t);
// Accepts f32/float32/float, f64/float64/double, f16/float16/half, bf16/bfloat16, i32/int32,
// i64/int64, u8/uint8/bool, f8e4m3/float8_e4m3fn. Throws Error(unknown_name) listing the valid names.
DType parse_dtype(std::string_view name);

// ---- 16-bit float conversions (Note [rounding]) ---------------------------------------------
inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: keep quiet
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);                             // ties to even
  return uint16_t((u + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Note [fp8 e4m3]: exact widening; rounding (nearest even), saturating narrowing.
float f8e4m3_to_f32(uint8_t b);
uint8_t f32_to_f8e4m3(float f);
inline constexpr float kF8e4m3Max = 448.0f;

// Storage types with conversions; layout is the raw 16 bits.
struct bf16_t {
  uint16_t bits;
  bf16_t() = default;
  explicit bf16_t(float f) : bits(f32_to_bf16(f)) {}
  explicit operator float() const { return bf16_to_f32(bits); }
};
struct f16_t {
  uint16_t bits;
  f16_t() = default;
  explicit f16_t(float f) : bits(f32_to_f16(f)) {}
  explicit operator float() const { return f16_to_f32(bits); }
};

// Map a C++ element type to its DType (used by typed accessors and kernels' templates).
template <class T> struct dtype_of;
struct f8e4m3_t {
  uint8_t bits;
  f8e4m3_t() = default;
  explicit f8e4m3_t(float f) : bits(f32_to_f8e4m3(f)) {}
  explicit operator float() const { return f8e4m3_to_f32(bits); }
};

template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<f16_t> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<bf16_t> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<f8e4m3_t> { static constexpr DType value = DType::f8e4m3; };

// Load any element as double / store a double into any element type (f16/bf16 through f32 with
// Note [rounding]; f8e4m3 through f32 with Note [fp8 e4m3]; integers truncate toward zero). For references and tools, not hot loops.
double load_as_double(const void* base, DType t, int64_t index);
void store_from_double(void* base, DType t, int64_t index, double v);

}  // namespace opforge
