// CPU kernel of quant_fp8: quant_fp8_cpu.
//
// Assumes: Note [row layout] (unit-stride rows, any uniform row stride), x in f32 / bf16 / f16
// (f64 goes to the reference: the predicate says so), the op's check has run.
//
// Bit-exact with the reference: every step of Note [fp8 quantization] is one correctly rounded
// f32 operation (max, the division for s and 1 / s, the multiply), and the vector e4m3
// conversion below is the scalar f32_to_f8e4m3 lane by lane (tests check both on all targets).
//
// Why it is fast:
// - One Highway source, runtime dispatch (4 / 8 / 16 f32 lanes); bf16 / f16 widened in registers.
// - f32 -> e4m3 is integer work on the f32 bit patterns (re-bias and round-to-nearest-even on
//   the exponent/mantissa, an f32 add for the subnormal steps, selects for saturation and NaN),
//   then one narrowing of 32-bit lanes to bytes.
// - per_token: each row is read from memory once; its amax pass pulls it into L1/L2 and the
//   quantize pass re-reads it from there, so the traffic is x + q, the roofline minimum.
//   per_tensor needs the global amax before any row can be quantized, so x is read twice
//   (one pass for the amax, one to quantize), as every implementation of this mode does.
// - OpenMP over tasks of rows from capacity_block (Note [tiling]); the per-tensor amax is the max
//   of per-task maxima, which is exact and independent of order and thread count.
//
// Measured 2026-11-26, `opforge bench --group large --dtype bf16`, on the project's shared 2-core
// AVX2 machine while other builds kept its load average at 12-15, so every figure is several
// times slower than on an idle machine (the copy ceiling measured in the same runs was 2.5-5.0
// GB/s, against 23.8 GB/s idle in docs/perf/cpu.md); rms_norm_cpu, run alongside as a yardstick,
// reached 24% of that ceiling at 1024 and 16384 tokens.
// quant_fp8 at 1024 / 16384 tokens x 4096: per_token 13% / 12%, per_tensor 11% / 11%, static
// 17% / 16% of the ceiling; 8-16x the reference kernel in the same run. 16 tokens (in cache, one
// thread) ran at 1.0-1.3 ns per element: the e4m3 rounding and narrowing cost more than the bytes.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/quant/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstring>
#include <vector>

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"
#include "ops/quant/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::quant_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

using D8 = hn::Rebind<uint8_t, DF>;

// Note [fp8 e4m3] on every lane: the bits of f32_to_f8e4m3 (dtype.cpp), in the low byte.
HWY_INLINE hn::Vec<DI> e4m3_bits(VF v) {
  const DF df;
  const DU du;
  const DI di;
  const VU u = hn::BitCast(du, v);
  const VU sign = hn::And(hn::ShiftRight<24>(u), hn::Set(du, 0x80u));
  const VU abs = hn::And(u, hn::Set(du, 0x7fffffffu));
  const auto abs_i = hn::BitCast(di, abs);
  const VU rebased = hn::Sub(abs, hn::Set(du, 120u << 23));
  const VU rounding = hn::Add(hn::Set(du, 0x7ffffu), hn::And(hn::ShiftRight<20>(rebased), hn::Set(du, 1u)));
  const VU normal = hn::ShiftRight<20>(hn::Add(rebased, rounding));
  const VU subnormal = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, abs), hn::Set(df, 16384.0f))),
                               hn::Set(du, 0x46800000u));
  VU r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_i, hn::Set(di, 0x3c800000))), subnormal, normal);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x43dfffff))), hn::Set(du, 0x7eu), r);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x7f800000))), hn::Set(du, 0x7fu), r);
  return hn::BitCast(di, hn::Or(r, sign));
}

HWY_INLINE void store_e4m3_n(VF v, uint8_t* p, size_t count) {
  const auto bytes = hn::DemoteTo(D8(), e4m3_bits(v));
  if (HWY_LIKELY(count == hn::Lanes(DF()))) return hn::StoreU(bytes, D8(), p);
  alignas(64) uint8_t buffer[kMaxLanes];
  hn::StoreU(bytes, D8(), buffer);
  std::memcpy(p, buffer, count);
}

// |v| with NaN lanes as 0 (Highway's Eq is false for NaN), so NaN never wins a max.
HWY_INLINE VF abs_no_nan(VF v) { return hn::IfThenElseZero(hn::Eq(v, v), hn::Abs(v)); }

template <class T> float row_amax(const T* x, int64_t hidden) {
  const DF d;
  VF m0 = hn::Zero(d), m1 = hn::Zero(d);
  const int64_t lanes = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + 2 * lanes <= hidden; i += 2 * lanes) {
    m0 = hn::Max(m0, abs_no_nan(load(x + i)));
    m1 = hn::Max(m1, abs_no_nan(load(x + i + lanes)));
  }
  for (; i < hidden; i += lanes) m0 = hn::Max(m0, abs_no_nan(load_n(x + i, size_t(std::min(lanes, hidden - i)))));
  return hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
}

template <class T> void quantize_row(const T* x, uint8_t* q, int64_t hidden, float inv) {
  const VF vinv = hn::Set(DF(), inv);
  for_each_vector(hidden, [&](int64_t i, size_t count) {
    store_e4m3_n(hn::Mul(load_n(x + i, count), vinv), q + i, count);
  });
}


template <class T> void token_rows_typed(const QuantRows& a, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const T* x = static_cast<const T*>(a.x) + row * a.x_stride;
    float amax = row_amax(x, a.hidden);
    if (a.scale_ub > 0 && amax > a.scale_ub) amax = a.scale_ub;
    const float s = fp8_scale_of(amax);
    a.scales[row * a.scale_stride] = s;
    quantize_row(x, a.q + row * a.q_stride, a.hidden, 1.0f / s);
  }
}

template <class T> void common_rows_typed(const QuantRows& a, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row)
    quantize_row(static_cast<const T*>(a.x) + row * a.x_stride, a.q + row * a.q_stride, a.hidden, a.inv);
}

template <class T> float amax_rows_typed(const QuantRows& a, int64_t begin, int64_t end) {
  float amax = 0;
  for (int64_t row = begin; row < end; ++row) {
    const float m = row_amax(static_cast<const T*>(a.x) + row * a.x_stride, a.hidden);
    if (m > amax) amax = m;
  }
  return amax;
}

void quant_token_rows(const QuantRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return token_rows_typed<bf16_t>(a, begin, end);
    case DType::f16: return token_rows_typed<f16_t>(a, begin, end);
    default: return token_rows_typed<float>(a, begin, end);
  }
}
void quant_common_rows(const QuantRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return common_rows_typed<bf16_t>(a, begin, end);
    case DType::f16: return common_rows_typed<f16_t>(a, begin, end);
    default: return common_rows_typed<float>(a, begin, end);
  }
}
float quant_amax_rows(const QuantRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return amax_rows_typed<bf16_t>(a, begin, end);
    case DType::f16: return amax_rows_typed<f16_t>(a, begin, end);
    default: return amax_rows_typed<float>(a, begin, end);
  }
}

// Vector conversion of raw f32 values (for tests: compared with the scalar conversion).
void e4m3_from_f32(const float* in, uint8_t* out, int64_t n) {
  for_each_vector(n, [&](int64_t i, size_t count) { store_e4m3_n(load_n(in + i, count), out + i, count); });
}

}  // namespace opforge::quant_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace quant_cpu {
HWY_EXPORT(quant_token_rows);
HWY_EXPORT(quant_common_rows);
HWY_EXPORT(quant_amax_rows);
HWY_EXPORT(e4m3_from_f32);
}  // namespace quant_cpu

// Used by tests/rotary_routing_quant_test.cpp: the vector f32 -> e4m3 conversion of the best
// target this machine runs.
void f32_to_f8e4m3_simd(const float* in, uint8_t* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(quant_cpu::e4m3_from_f32)(in, out, n);
}

void quant_fp8_cpu(const Context&, const TensorView& q, const TensorView& scale,
                   const TensorView& x, const TensorView& static_scale, std::string_view mode,
                   double scale_ub) {
  const QuantMode m = parse_quant_mode(QuantFp8::name, mode);
  QuantRows a{x.dtype, x.data, x.row_stride(), x.size(-1), static_cast<uint8_t*>(q.data),
                         q.row_stride(), static_cast<float*>(scale.data),
                         scale.numel() > 1 ? scale.row_stride() : 1, 0.0f, float(scale_ub)};
  // Note [tiling]: a task's rows (x and q bytes) fit half of a core's L2.
  cpu::TileSpec spec;
  spec.bytes_per_element = x.itemsize() + 1;
  spec.multiplier = std::max<int64_t>(x.size(-1), 1);
  spec.level = cpu::CacheLevel::l2;
  const cpu::RowTasks tasks{x.rows(), cpu::capacity_block(spec)};
  if (m == QuantMode::per_token) {
    auto* fn = HWY_DYNAMIC_DISPATCH(quant_cpu::quant_token_rows);
    cpu::parallel_tasks(tasks.count(), [&](int64_t t) { fn(a, tasks.begin(t), tasks.end(t)); });
    return;
  }
  float s;
  if (m == QuantMode::static_scale) {
    s = *static_cast<const float*>(static_scale.data);
  } else {
    std::vector<float> maxima(size_t(std::max<int64_t>(tasks.count(), 1)), 0.0f);
    auto* amax_fn = HWY_DYNAMIC_DISPATCH(quant_cpu::quant_amax_rows);
    cpu::parallel_tasks(tasks.count(), [&](int64_t t) {
      maxima[size_t(t)] = amax_fn(a, tasks.begin(t), tasks.end(t));
    });
    float amax = 0;
    for (float v : maxima) amax = v > amax ? v : amax;
    s = fp8_scale_of(amax);
  }
  *static_cast<float*>(scale.data) = s;
  a.inv = 1.0f / s;
  auto* fn = HWY_DYNAMIC_DISPATCH(quant_cpu::quant_common_rows);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { fn(a, tasks.begin(t), tasks.end(t)); });
}

const char* quant_fp8_cpu_applicable(const TensorView&, const TensorView&, const TensorView& x,
                                     const TensorView&, std::string_view, double) {
  if (!x.device.is_cpu()) return "tensors are not on the cpu";
  switch (x.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

}  // namespace opforge
#endif  // HWY_ONCE
