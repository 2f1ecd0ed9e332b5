#include "opforge/dtype.h"

#include <cmath>
#include <string>

#include "opforge/error.h"

namespace opforge {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::f8e4m3: return "f8e4m3";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  struct Alias { const char* name; DType t; };
  static const Alias aliases[] = {
      {"f32", DType::f32},   {"float32", DType::f32}, {"float", DType::f32},
      {"f64", DType::f64},   {"float64", DType::f64}, {"double", DType::f64},
      {"f16", DType::f16},   {"float16", DType::f16}, {"half", DType::f16},
      {"bf16", DType::bf16}, {"bfloat16", DType::bf16},
      {"i32", DType::i32},   {"int32", DType::i32},
      {"i64", DType::i64},   {"int64", DType::i64},
      {"u8", DType::u8},     {"uint8", DType::u8},    {"bool", DType::u8},
      {"f8e4m3", DType::f8e4m3}, {"float8_e4m3fn", DType::f8e4m3}};
  for (const Alias& a : aliases)
    if (s == a.name) return a.t;
  throw Error(ErrorCode::unknown_name,
              "unknown dtype '" + std::string(s) + "'; valid: f32, f64, f16, bf16, i32, i64, u8 (bool), f8e4m3");
}

// f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return f32_from_bits(sign);  // +-0
  // Subnormal: value = mant * 2^-24, exact in f32.
  float v = float(mant) * 0x1p-24f;
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN, quiet
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (abs >= 0x38800000u) {                                 // normal f16 (>= 2^-14)
    // Re-bias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
    uint32_t rebased = abs - (112u << 23);
    uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return uint16_t(sign | ((rebased + rounding) >> 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): +-0
  // Subnormal f16: value / 2^-24 rounded to nearest even integer, done on the mantissa.
  uint32_t exp = abs >> 23;
  uint32_t mant = (abs & 0x7fffffu) | 0x800000u;  // implicit bit
  uint32_t shift = 126 - exp;                     // so that result = mant >> shift
  uint32_t result = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (result & 1u))) ++result;
  return uint16_t(sign | result);
}

// Note [fp8 e4m3]. Exponent field e (bias 7), mantissa m: e == 0 is m * 2^-9, e == 15 with
// m == 7 is NaN, anything else (1 + m/8) * 2^(e-7).
float f8e4m3_to_f32(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
  float v;
  if (e == 15 && m == 7) v = f32_from_bits(0x7fc00000u);
  else if (e == 0) v = float(m) * 0x1p-9f;
  else v = f32_from_bits(((e + 120) << 23) | (m << 20));
  return (b & 0x80u) ? -v : v;
}

uint8_t f32_to_f8e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint8_t(sign | 0x7fu);  // NaN
  if (abs >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448 (and infinity): saturate
  if (abs >= 0x3c800000u) {                                // normal e4m3 (>= 2^-6)
    // Re-bias the exponent (127 -> 7) and round the 20 dropped bits to nearest even. Values just
    // below 448 round at most to 448 (0x7e), never into the NaN pattern.
    const uint32_t rebased = abs - (120u << 23);
    const uint32_t rounding = 0x7ffffu + ((rebased >> 20) & 1u);
    return uint8_t(sign | ((rebased + rounding) >> 20));
  }
  // Subnormal range: adding 2^14 leaves an f32 whose ulp is 2^-9, the e4m3 subnormal step, so the
  // addition rounds to nearest even; the low bits are the count of steps (8 = the smallest normal).
  const float shifted = f32_from_bits(abs) + 16384.0f;
  return uint8_t(sign | (f32_bits(shifted) - 0x46800000u));
}

double load_as_double(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::i32: return static_cast<const int32_t*>(base)[i];
    case DType::i64: return double(static_cast<const int64_t*>(base)[i]);
    case DType::u8: return static_cast<const uint8_t*>(base)[i];
    case DType::f8e4m3: return f8e4m3_to_f32(static_cast<const uint8_t*>(base)[i]);
  }
  return 0;
}

// f64 -> f32 rounding to odd: an inexact result gets its last mantissa bit set. Rounding that
// to f16 / bf16 (13+ fewer bits) to nearest even then equals rounding the f64 directly, which a
// plain f64 -> f32 -> f16 chain does not (it can round twice across a halfway point).
static float f64_to_f32_round_to_odd(double v) {
  float f = float(v);
  if (std::isnan(v) || std::isinf(f) || double(f) == v) return f;
  uint32_t u = f32_bits(f);
  if ((u & 1u) == 0) u = std::fabs(double(f)) > std::fabs(v) ? u - 1 : u + 1;
  return f32_from_bits(u);
}

// Integer stores truncate toward zero and saturate; NaN stores 0 (a cast would be undefined).
static double saturate(double v, double lo, double hi) {
  if (std::isnan(v)) return 0;
  return v < lo ? lo : (v > hi ? hi : v);
}

void store_from_double(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = float(v); return;
    case DType::f64: static_cast<double*>(base)[i] = v; return;
    case DType::f16: static_cast<uint16_t*>(base)[i] = f32_to_f16(f64_to_f32_round_to_odd(v)); return;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(f64_to_f32_round_to_odd(v)); return;
    case DType::i32: static_cast<int32_t*>(base)[i] = int32_t(saturate(v, -0x1p31, 0x1p31 - 1)); return;
    case DType::i64: static_cast<int64_t*>(base)[i] = int64_t(saturate(v, -0x1p63, 0x1p63 - 1024)); return;
    case DType::u8: static_cast<uint8_t*>(base)[i] = uint8_t(saturate(v, 0, 255)); return;
    // Round to odd keeps the single rounding (f8 has 20 fewer mantissa bits than f32).
    case DType::f8e4m3: static_cast<uint8_t*>(base)[i] = f32_to_f8e4m3(f64_to_f32_round_to_odd(v)); return;
  }
}

}  // namespace opforge
