// The 16-bit float conversions of include/opforge/dtype.h (Note [rounding]).
//
// Every one of the 65,536 bf16 and f16 bit patterns: widening to f32 and narrowing back gives
// the same bits (a NaN stays a NaN of the same sign, made quiet). Narrowing f32 is compared with
// independent models on every halfway point between neighbouring 16-bit values (and one f32 ulp
// either side), the subnormal ranges, the overflow boundary and millions of random f32 patterns:
//  - a model that rounds in double precision with std::nearbyint (ties to even) and encodes the
//    result from its exponent and significand, for both formats;
//  - for f16 also the compiler's _Float16 conversion (IEEE round-to-nearest-even), when the
//    compiler has one.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "opforge/dtype.h"
#include "opforge/error.h"

namespace opforge {
namespace {

// ---- independent models ------------------------------------------------------------------------
// A binary floating-point format with `precision` significand bits (implicit bit included), the
// smallest normal exponent `min_exp` and the largest finite exponent `max_exp`.
struct Format {
  int precision;
  int min_exp;
  int max_exp;
  int exp_bits;
};
constexpr Format kF16{11, -14, 15, 5};
constexpr Format kBF16{8, -126, 127, 8};

// Round a finite double (an exact f32 value) to the format, ties to even; Inf on overflow.
double round_to_format(double x, const Format& f) {
  if (x == 0) return x;
  int e = std::ilogb(x);                      // x = m * 2^e, 1 <= |m| < 2
  int q = std::max(e, f.min_exp) - (f.precision - 1);  // the quantum's exponent
  double r = std::nearbyint(std::ldexp(x, -q));        // exact scaling, then ties to even
  double y = std::ldexp(r, q);
  double max_finite = std::ldexp(2.0 - std::ldexp(1.0, 1 - f.precision), f.max_exp);
  if (std::fabs(y) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return y;
}

// The bit pattern of a value that is exactly representable in the format (or +-Inf).
uint16_t encode(double y, const Format& f) {
  const int mant_bits = f.precision - 1;
  const uint16_t sign = std::signbit(y) ? uint16_t(0x8000) : uint16_t(0);
  const uint32_t exp_all_ones = (1u << f.exp_bits) - 1;
  double a = std::fabs(y);
  if (std::isinf(a)) return uint16_t(sign | (exp_all_ones << mant_bits));
  if (a == 0) return sign;
  int e = std::ilogb(a);
  if (e < f.min_exp) {  // subnormal: a = mant * 2^(min_exp - mant_bits)
    return uint16_t(sign | uint32_t(std::ldexp(a, mant_bits - f.min_exp)));
  }
  uint32_t mant = uint32_t(std::ldexp(a, mant_bits - e)) - (1u << mant_bits);
  uint32_t biased = uint32_t(e + (1 << (f.exp_bits - 1)) - 1);
  return uint16_t(sign | (biased << mant_bits) | mant);
}

uint16_t model_f16(float x) { return encode(round_to_format(x, kF16), kF16); }
uint16_t model_bf16(float x) { return encode(round_to_format(x, kBF16), kBF16); }

#ifdef __FLT16_MANT_DIG__
#define OPFORGE_HAVE_FLOAT16 1
uint16_t compiler_f16(float x) {
  _Float16 h = static_cast<_Float16>(x);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
#endif

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }
std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Checks one f32 input against the models; counts mismatches (reports the first few).
struct Checker {
  int failures = 0;
  void check(float x) {
    if (std::isnan(x)) return check_nan(x);
    expect("f16", x, f32_to_f16(x), model_f16(x));
#ifdef OPFORGE_HAVE_FLOAT16
    expect("f16 vs _Float16", x, f32_to_f16(x), compiler_f16(x));
#endif
    expect("bf16", x, f32_to_bf16(x), model_bf16(x));
  }
  void check_nan(float x) {
    const uint16_t h = f32_to_f16(x), b = f32_to_bf16(x);
    const bool negative = std::signbit(x);
    if (!f16_is_nan(h) || !(h & 0x0200u) || bool(h & 0x8000u) != negative) report("f16 NaN", x, h, 0);
    if (!bf16_is_nan(b) || !(b & 0x0040u) || bool(b & 0x8000u) != negative) report("bf16 NaN", x, b, 0);
  }
  void expect(const char* what, float x, uint16_t got, uint16_t want) {
    if (got != want) report(what, x, got, want);
  }
  void report(const char* what, float x, uint16_t got, uint16_t want) {
    if (++failures <= 10)
      ADD_FAILURE() << what << ": f32 " << hex(f32_bits(x)) << " (" << x << ") -> " << hex(got)
                    << ", expected " << hex(want);
  }
};

// ---- exhaustive round trips ------------------------------------------------------------------
TEST(DType, Bf16WidenNarrowRoundTripsEveryPattern) {
  int failures = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t h = uint16_t(bits);
    const uint16_t back = f32_to_bf16(bf16_to_f32(h));
    const bool ok = bf16_is_nan(h) ? bf16_is_nan(back) && (back & 0x0040u) &&
                                         (back & 0x8000u) == (h & 0x8000u)
                                   : back == h;
    if (!ok && ++failures <= 10) ADD_FAILURE() << "bf16 " << hex(h) << " -> " << hex(back);
  }
  EXPECT_EQ(failures, 0);
}

TEST(DType, F16WidenNarrowRoundTripsEveryPattern) {
  int failures = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t h = uint16_t(bits);
    const float wide = f16_to_f32(h);
    const uint16_t back = f32_to_f16(wide);
    bool ok = f16_is_nan(h) ? f16_is_nan(back) && (back & 0x0200u) &&
                                  (back & 0x8000u) == (h & 0x8000u) && std::isnan(wide)
                            : back == h;
#ifdef OPFORGE_HAVE_FLOAT16
    _Float16 as_compiler;
    std::memcpy(&as_compiler, &h, 2);
    if (!f16_is_nan(h)) ok = ok && f32_bits(wide) == f32_bits(float(as_compiler));
#endif
    if (!ok && ++failures <= 10) ADD_FAILURE() << "f16 " << hex(h) << " -> " << hex(back);
  }
  EXPECT_EQ(failures, 0);
}

TEST(DType, F16WideningMatchesTheFormula) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t h = uint16_t(bits);
    if ((h & 0x7c00u) == 0x7c00u) continue;  // Inf / NaN: covered by the round trip
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v = exp ? std::ldexp(1024 + mant, exp - 25) : std::ldexp(mant, -24);
    if (h & 0x8000u) v = -v;
    ASSERT_EQ(double(f16_to_f32(h)), v) << hex(h);
    ASSERT_EQ(std::signbit(f16_to_f32(h)), bool(h & 0x8000u)) << hex(h);
  }
}

// ---- narrowing against the models --------------------------------------------------------------
// The f32 value halfway between 16-bit pattern h and h + 1 (positive, finite h), for a format
// whose values widen to f32 through `widen`.
template <class Widen> void check_halfway_points(Checker& c, Widen widen, uint16_t last) {
  for (uint32_t h = 0; h < last; ++h) {
    const double lo = widen(uint16_t(h)), hi = widen(uint16_t(h + 1));
    const float mid = float((lo + hi) / 2);  // exact: the midpoint needs one more bit than h
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      c.check(x);
      c.check(-x);
    }
  }
}

TEST(DType, NarrowingHalfwayPointsRoundToEven) {
  Checker c;
  check_halfway_points(c, f16_to_f32, 0x7bffu);   // up to the largest finite f16
  check_halfway_points(c, bf16_to_f32, 0x7f7fu);  // up to the largest finite bf16
  EXPECT_EQ(c.failures, 0);
}

TEST(DType, NarrowingSubnormalsAndTinyValues) {
  Checker c;
  // f32 subnormals, and the range where f16 subnormals live (2^-25 .. 2^-14), both with an odd
  // stride so every low-bit pattern occurs (the halfway-point test covers each rounding boundary).
  for (uint32_t bits = 0; bits < 0x00800000u; bits += 61) c.check(f32_from_bits(bits));
  for (uint32_t bits = 0x33000000u - 4; bits <= 0x38800000u + 4; bits += 97) {
    c.check(f32_from_bits(bits));
    c.check(-f32_from_bits(bits));
  }
  EXPECT_EQ(c.failures, 0);
}

TEST(DType, NarrowingOverflowBoundary) {
  Checker c;
  // f16: 65504 is the largest finite value, 65520 the first that rounds to Inf.
  for (uint32_t bits = 0x477fe000u - 64; bits <= 0x477ff000u + 64; ++bits) c.check(f32_from_bits(bits));
  // bf16: values near FLT_MAX round to Inf past the largest finite bf16.
  for (uint32_t bits = 0x7f7f0000u; bits <= 0x7f7fffffu; ++bits) c.check(f32_from_bits(bits));
  c.check(INFINITY);
  c.check(-INFINITY);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bffu);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bffu);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00u);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_EQ(c.failures, 0);
}

TEST(DType, NarrowingNaNsStayQuietNaNsWithTheirSign) {
  Checker c;
  for (uint32_t payload = 1; payload < 0x00800000u; payload = payload * 3 + 1) {
    c.check(f32_from_bits(0x7f800000u | payload));
    c.check(f32_from_bits(0xff800000u | payload));
  }
  c.check(std::numeric_limits<float>::quiet_NaN());
  c.check(std::numeric_limits<float>::signaling_NaN());
  EXPECT_EQ(c.failures, 0);
}

TEST(DType, NarrowingRandomF32Patterns) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  Checker c;
  std::mt19937 rng(20240611);
  for (int i = 0; i < 4'000'000; ++i) c.check(f32_from_bits(uint32_t(rng())));
  // Values in the 16-bit formats' normal range, where random bit patterns rarely land for f16.
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  for (int i = 0; i < 1'000'000; ++i) c.check(in_range(rng));
  EXPECT_EQ(c.failures, 0);
}

// ---- other dtype helpers -------------------------------------------------------------------------
TEST(DType, SizesNamesAndParsing) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_GT(dtype_size(t), 0);
  }
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_EQ(parse_dtype("bool"), DType::u8);
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i64));
  try {
    parse_dtype("float8");
    ADD_FAILURE() << "parse_dtype accepted 'float8'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unknown_name);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}

TEST(DType, LoadAndStoreAsDouble) {
  std::vector<uint8_t> buf(64);
  for (DType t : kAllDTypes) {
    store_from_double(buf.data(), t, 2, 3.0);
    EXPECT_EQ(load_as_double(buf.data(), t, 2), 3.0) << dtype_name(t);
  }
  store_from_double(buf.data(), DType::i32, 0, -7.9);
  EXPECT_EQ(load_as_double(buf.data(), DType::i32, 0), -7.0);  // truncates toward zero
  store_from_double(buf.data(), DType::u8, 0, 300.0);
  EXPECT_EQ(load_as_double(buf.data(), DType::u8, 0), 255.0);  // saturates
  store_from_double(buf.data(), DType::bf16, 1, 1.0 + 1.0 / 256);  // a tie: rounds to even (1.0)
  EXPECT_EQ(load_as_double(buf.data(), DType::bf16, 1), 1.0);
}

}  // namespace
}  // namespace opforge

// store_from_double rounds an f64 to f16/bf16 once (round to odd through f32), so values just
// above a 16-bit halfway point by less than an f32 ulp still round up, and just below round down.
TEST(DType, StoreFromDoubleRoundsOnceForSixteenBitTypes) {
  auto bf16_of = [](double v) {
    uint16_t h = 0;
    opforge::store_from_double(&h, opforge::DType::bf16, 0, v);
    return opforge::bf16_to_f32(h);
  };
  auto f16_of = [](double v) {
    uint16_t h = 0;
    opforge::store_from_double(&h, opforge::DType::f16, 0, v);
    return opforge::f16_to_f32(h);
  };
  // bf16 around 1: ulp 2^-7, halfway 1 + 2^-8; 2^-30 is far below an f32 ulp of 1 (2^-23).
  EXPECT_EQ(bf16_of(1.0 + 0x1p-8 + 0x1p-30), 1.0f + 0x1p-7f);
  EXPECT_EQ(bf16_of(1.0 + 0x1p-8 - 0x1p-30), 1.0f);
  EXPECT_EQ(bf16_of(-(1.0 + 0x1p-8 + 0x1p-30)), -(1.0f + 0x1p-7f));
  EXPECT_EQ(bf16_of(1.0 + 0x1p-8), 1.0f);  // an exact tie still goes to even
  // f16 around 1: ulp 2^-10, halfway 1 + 2^-11.
  EXPECT_EQ(f16_of(1.0 + 0x1p-11 + 0x1p-40), 1.0f + 0x1p-10f);
  EXPECT_EQ(f16_of(1.0 + 0x1p-11 - 0x1p-40), 1.0f);
  // Tiny values below f32's range still round to the smallest f16 subnormal or zero correctly.
  EXPECT_EQ(f16_of(0x1p-25 + 0x1p-70), 0x1p-24f);  // just above half the smallest subnormal
  EXPECT_EQ(f16_of(0x1p-25), 0.0f);                  // the exact tie goes to even (zero)
  EXPECT_EQ(f16_of(0x1p-200), 0.0f);
}
