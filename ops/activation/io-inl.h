// Loads and stores of the activation cpu kernels (cpu.cpp): one vector, interleaved (gate, up)
// pairs, and blocks of two vectors (Note [block order]) of f32 / bf16 / f16 <-> f32 vectors,
// compiled once per Highway target (include after "hwy/foreach_target.h", like
// backends/cpu/simd-inl.h).

#if defined(OPFORGE_OPS_ACTIVATION_IO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_ACTIVATION_IO_INL_H_
#undef OPFORGE_OPS_ACTIVATION_IO_INL_H_
#else
#define OPFORGE_OPS_ACTIVATION_IO_INL_H_
#endif

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"

#if HWY_TARGET == HWY_AVX2
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace opforge::activation_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

#undef OPFORGE_ACTIVATION_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define OPFORGE_ACTIVATION_F16C 1
using DH = hn::Rebind<hwy::float16_t, DF>;
#else
#define OPFORGE_ACTIVATION_F16C 0
#endif

// ---- one vector of T <-> f32 --------------------------------------------------------------------
template <class T> HWY_INLINE VF load_vec(const T* p) {
#if OPFORGE_ACTIVATION_F16C
  if constexpr (std::is_same_v<T, f16_t>)
    return hn::PromoteTo(DF(), hn::LoadU(DH(), reinterpret_cast<const hwy::float16_t*>(p)));
#endif
  return load(p);
}

template <class T> HWY_INLINE VF load_part(const T* p, size_t count) {
  if (HWY_LIKELY(count == hn::Lanes(DF()))) return load_vec(p);
  alignas(64) T buffer[kMaxLanes];
  std::memset(static_cast<void*>(buffer), 0, sizeof buffer);
  std::memcpy(static_cast<void*>(buffer), p, count * sizeof(T));
  return load_vec(buffer);
}

// The bf16 / f16 bits of v in 16-bit lanes, rounded by Note [vector rounding].
template <class T> HWY_INLINE hn::Vec<D16> narrow_bits(VF v) {
#if OPFORGE_ACTIVATION_F16C
  if constexpr (std::is_same_v<T, f16_t>) return hn::BitCast(D16(), hn::DemoteTo(DH(), v));
#endif
  if constexpr (std::is_same_v<T, f16_t>) return hn::DemoteTo(D16(), hn::BitCast(DI(), f16_bits(v)));
  return hn::DemoteTo(D16(), hn::BitCast(DI(), bf16_bits(v)));
}

// Bytes of one stored vector of T: a streamed store needs its address aligned to them.
template <class T> HWY_INLINE size_t vector_bytes() { return hn::Lanes(DF()) * sizeof(T); }
template <class T> HWY_INLINE bool stream_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % vector_bytes<T>() == 0;
}

// `stream`: Note [streaming stores]; p is then aligned (stream_aligned).
template <class T> HWY_INLINE void store_vec(VF v, T* p, bool stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (stream) return hn::Stream(v, DF(), p);
    return hn::StoreU(v, DF(), p);
  } else {
    const auto bits = narrow_bits<T>(v);
    if (stream) return hn::Stream(bits, D16(), &p->bits);
    hn::StoreU(bits, D16(), &p->bits);
  }
}

template <class T> HWY_INLINE void store_part(VF v, T* p, size_t count, bool stream) {
  if (HWY_LIKELY(count == hn::Lanes(DF()))) return store_vec(v, p, stream);
  alignas(64) T buffer[kMaxLanes];
  store_vec(v, buffer, false);
  std::memcpy(static_cast<void*>(p), buffer, count * sizeof(T));
}

// ---- interleaved (gate, up) pairs: swigluoai_and_mul --------------------------------------------
// 16-bit lanes held in the low half of u32 lanes <-> f32.
template <class T> HWY_INLINE VF widen_bits(VU bits) {
  if constexpr (std::is_same_v<T, bf16_t>) return bf16_bits_to_f32(bits);
#if OPFORGE_ACTIVATION_F16C
  return hn::PromoteTo(DF(), hn::BitCast(DH(), hn::DemoteTo(D16(), hn::BitCast(DI(), bits))));
#else
  return f16_bits_to_f32(bits);
#endif
}
template <class T> HWY_INLINE VU bits_u32(VF v) { return hn::PromoteTo(DU(), narrow_bits<T>(v)); }

// count <= Lanes pairs at p: gates into a, up values into b.
template <class T> HWY_INLINE void load_pairs(const T* p, size_t count, VF& a, VF& b) {
  const size_t lanes = hn::Lanes(DF());
  alignas(64) T buffer[2 * kMaxLanes];
  if (HWY_UNLIKELY(count != lanes)) {
    std::memset(static_cast<void*>(buffer), 0, sizeof buffer);
    std::memcpy(static_cast<void*>(buffer), p, 2 * count * sizeof(T));
    p = buffer;
  }
  if constexpr (std::is_same_v<T, float>) {
    hn::LoadInterleaved2(DF(), p, a, b);
  } else {
    // One u32 lane per pair: gate bits low, up bits high (little-endian).
    const VU w = hn::LoadU(DU(), reinterpret_cast<const uint32_t*>(p));
    a = widen_bits<T>(hn::And(w, hn::Set(DU(), 0xffffu)));
    b = widen_bits<T>(hn::ShiftRight<16>(w));
  }
}

template <class T> HWY_INLINE void store_pairs(VF a, VF b, T* p, size_t count, bool stream) {
  const size_t lanes = hn::Lanes(DF());
  alignas(64) T buffer[2 * kMaxLanes];
  T* to = count == lanes ? p : buffer;
  if constexpr (std::is_same_v<T, float>) {
    hn::StoreInterleaved2(a, b, DF(), to);  // never streamed (Note [streaming stores])
  } else {
    const VU w = hn::Or(bits_u32<T>(a), hn::ShiftLeft<16>(bits_u32<T>(b)));
    uint32_t* to32 = reinterpret_cast<uint32_t*>(to);
    if (stream && count == lanes) hn::Stream(w, DU(), to32);
    else hn::StoreU(w, DU(), to32);
  }
  if (count != lanes) std::memcpy(static_cast<void*>(p), buffer, 2 * count * sizeof(T));
}

// ---- blocks of two vectors ------------------------------------------------------------------------
// Note [block order]: the halves and pointwise kernels work on blocks of 2 * Lanes elements held in
// two f32 vectors lo, hi. On AVX2, a bf16 block is widened by interleaving with zeros per 128-bit
// half (lo = elements 0-3 and 8-11, hi = 4-7 and 12-15) and narrowed by the matching pack, one
// instruction per vector each way instead of a widening load, a pack and a lane permute per
// vector; store_block undoes exactly the order load_block made, so elementwise code never sees
// it. Elsewhere lo and hi are the two halves in order.
struct Block {
  VF lo, hi;
};

#if HWY_TARGET == HWY_AVX2
// bf16 bits of v, rounded to nearest even, in the high 16 bits of each u32 lane shifted down.
// No NaN case (Note [vector rounding] needs one): every NaN of these kernels comes from a bf16
// input or from an invalid operation (x86's default NaN), so its low 16 bits are zero and the
// rounding increment (at most 0x8000) cannot carry into the kept bits.
HWY_INLINE __m256i bf16_round_bits(VF v) {
  const DU du;
  const VU u = hn::BitCast(du, v);
  const VU odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  return hn::ShiftRight<16>(hn::Add(u, hn::Add(odd, hn::Set(du, 0x7fffu)))).raw;
}
#endif

template <class T> HWY_INLINE Block load_block_full(const T* p) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (std::is_same_v<T, bf16_t>) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    return {VF{_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v))},
            VF{_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v))}};
  }
#endif
  return {load_vec(p), load_vec(p + hn::Lanes(DF()))};
}

// `stream`: Note [streaming stores]; p is then aligned to block_bytes<T>().
template <class T> HWY_INLINE void store_block_full(const Block& b, T* p, bool stream) {
#if HWY_TARGET == HWY_AVX2
  if constexpr (std::is_same_v<T, bf16_t>) {
    const __m256i packed = _mm256_packus_epi32(bf16_round_bits(b.lo), bf16_round_bits(b.hi));
    __m256i* to = reinterpret_cast<__m256i*>(p);
    if (stream) return _mm256_stream_si256(to, packed);
    return _mm256_storeu_si256(to, packed);
  }
#endif
  store_vec(b.lo, p, stream);
  store_vec(b.hi, p + hn::Lanes(DF()), stream);
}

// count <= 2 * Lanes f32 values at src, in order, stored as T at p (`stream`: p aligned to
// block_bytes<T>()). On AVX2 a full bf16 pair of vectors takes one pack and one in-lane-order
// permute (vpermq) instead of a per-vector NaN-aware rounding, pack and permute.
template <class T> HWY_INLINE void store_in_order(const float* src, T* p, size_t count, bool stream) {
  const DF d;
  const size_t lanes = hn::Lanes(d);
#if HWY_TARGET == HWY_AVX2
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (HWY_LIKELY(count == 2 * lanes)) {
      const __m256i packed = _mm256_permute4x64_epi64(
          _mm256_packus_epi32(bf16_round_bits(hn::Load(d, src)), bf16_round_bits(hn::Load(d, src + lanes))),
          0xD8);
      __m256i* to = reinterpret_cast<__m256i*>(p);
      if (stream) return _mm256_stream_si256(to, packed);
      return _mm256_storeu_si256(to, packed);
    }
  }
#endif
  store_part(hn::Load(d, src), p, std::min(count, lanes), stream && count == 2 * lanes);
  if (count > lanes) store_part(hn::Load(d, src + lanes), p + lanes, count - lanes, stream && count == 2 * lanes);
}

template <class T> HWY_INLINE size_t block_bytes() { return 2 * vector_bytes<T>(); }
template <class T> HWY_INLINE bool block_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % block_bytes<T>() == 0;
}

// count <= 2 * Lanes elements; a short block goes through a zeroed buffer.
template <class T> HWY_INLINE Block load_block(const T* p, size_t count) {
  if (HWY_LIKELY(count == 2 * hn::Lanes(DF()))) return load_block_full(p);
  alignas(64) T buffer[2 * kMaxLanes];
  std::memset(static_cast<void*>(buffer), 0, sizeof buffer);
  std::memcpy(static_cast<void*>(buffer), p, count * sizeof(T));
  return load_block_full(buffer);
}

template <class T> HWY_INLINE void store_block(const Block& b, T* p, size_t count, bool stream) {
  if (HWY_LIKELY(count == 2 * hn::Lanes(DF()))) return store_block_full(b, p, stream);
  alignas(64) T buffer[2 * kMaxLanes];
  store_block_full(b, buffer, false);
  std::memcpy(static_cast<void*>(p), buffer, count * sizeof(T));
}

// body(i, count) for i = 0, 2N, 4N, ... < n with count = min(2N, n - i), N = Lanes.
template <class Body> HWY_INLINE void for_each_block(int64_t n, Body&& body) {
  const int64_t step = 2 * int64_t(hn::Lanes(DF()));
  int64_t i = 0;
  for (; i + step <= n; i += step) body(i, size_t(step));
  if (i < n) body(i, size_t(n - i));
}

}  // namespace opforge::activation_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
