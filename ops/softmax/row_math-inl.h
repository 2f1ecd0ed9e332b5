// Row statistics of the softmax and loss families, compiled once per Highway target.
//
// Include after "hwy/foreach_target.h", "backends/cpu/simd-inl.h" and
// "hwy/contrib/math/math-inl.h" in a kernel file; the per-target include guard lets
// foreach_target re-include it.
//
// Note [online softmax blocks]: a row's log-sum-exp is taken in one read of the row from memory.
// The row is walked in blocks of `block` elements (Note [tiling], L1): each block is widened to
// f32 into scratch, its max taken, the running sum rescaled once by exp(m_old - m_new) if the max
// grew, and exp(v - m) summed from the L1 copy. One vector exp per element (the per-element
// online update of Milakov & Gimelshein needs two), one scalar exp per block. Blocks whose values
// are all -inf (masked) add nothing, so masked prefixes do not turn the sum into NaN.

#if defined(OPFORGE_OPS_SOFTMAX_ROW_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef OPFORGE_OPS_SOFTMAX_ROW_MATH_INL_H_
#undef OPFORGE_OPS_SOFTMAX_ROW_MATH_INL_H_
#else
#define OPFORGE_OPS_SOFTMAX_ROW_MATH_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for x <= 88 (x - max, z - lse: never far above 0), faster than hn::Exp: 2^t with t = x
// log2(e) = n + f, n = round(t), f in [-1/2, 1/2]; 2^f is a degree-5 polynomial fitted for
// relative error with p(0) = 1 exactly (below 2e-7 in f32 arithmetic; t's own rounding adds up
// to 2.6e-6 relative where |x| is near 88, terms 1e-38 of the row's largest), and 2^n goes into
// the exponent: on AVX-512 by vscalefps, which also takes the underflow to 0, elsewhere by adding
// n << 23 to the bits, zero below t = -126. t is held above -160 so that a masked logit (-inf)
// gives 0, not NaN. 11 vector operations on AVX-512 (14 elsewhere) against hn::Exp's 27, which
// also handles overflow and the subnormal range; a NaN gives 0.
HWY_INLINE VF exp_bounded(VF x) {
  const DF d;
  const VF t = hn::Max(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), hn::Set(d, -160.0f));
  const VF n = hn::Round(t);
  const VF f = hn::Sub(t, n);
  VF p = hn::Set(d, 1.32647180e-3f);
  p = hn::MulAdd(p, f, hn::Set(d, 9.67151299e-3f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.55073395e-2f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.40222424e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.93147004e-1f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return VF{_mm512_scalef_ps(p.raw, n.raw)};
#else
  const DI di;
  const auto scaled = hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::ConvertTo(di, n)));
  return hn::IfThenElseZero(hn::Ge(t, hn::Set(d, -126.0f)), hn::BitCast(d, scaled));
#endif
}

// log(x) without hn::Log's divide: x = 2^k m with m in [0.75, 1.5) from the bits (k by an
// arithmetic shift of the bits less those of 0.75), u = m - 1 in [-1/4, 1/2), log(1 + u) = u +
// u^2 q(u) with q a degree-7 polynomial fitted for relative error (below 1.1e-7 in f32
// arithmetic, so log(x) near x = 1 keeps its relative precision), plus k ln 2 in one FMA. About
// 17 vector operations against hn::Log's 25 with a divide. Lanes outside the positive normal
// range (0, subnormals, infinities, NaN, negatives) take hn::Log's answer, computed only for a
// vector that has one.
HWY_INLINE VF log_normal_fast(VF x) {
  const DF d;
  const DI di;
  const auto bits = hn::BitCast(di, x);
  const auto k = hn::ShiftRight<23>(hn::Sub(bits, hn::Set(di, 0x3F400000)));
  const VF u = hn::Sub(hn::BitCast(d, hn::Sub(bits, hn::ShiftLeft<23>(k))), hn::Set(d, 1.0f));
  VF q = hn::Set(d, 5.41315041e-2f);
  q = hn::MulAdd(q, u, hn::Set(d, -1.20672889e-1f));
  q = hn::MulAdd(q, u, hn::Set(d, 1.49839163e-1f));
  q = hn::MulAdd(q, u, hn::Set(d, -1.68228224e-1f));
  q = hn::MulAdd(q, u, hn::Set(d, 1.99770778e-1f));
  q = hn::MulAdd(q, u, hn::Set(d, -2.49934420e-1f));
  q = hn::MulAdd(q, u, hn::Set(d, 3.33335489e-1f));
  q = hn::MulAdd(q, u, hn::Set(d, -5.00000596e-1f));
  const VF log_m = hn::MulAdd(hn::Mul(u, u), q, u);
  const VF r = hn::MulAdd(hn::ConvertTo(d, k), hn::Set(d, 0.693147180559945309f), log_m);
  const auto normal = hn::And(hn::Ge(x, hn::Set(d, 1.17549435e-38f)), hn::Le(x, hn::Set(d, 3.40282347e+38f)));
  if (HWY_LIKELY(hn::AllTrue(d, normal))) return r;
  return hn::IfThenElse(normal, r, hn::Log(d, x));
}

// The output sweep of a row: out[i, i + lanes) = value(i, count) one vector at a time, full vectors
// by store<kStream> (Note [streaming stores]: the caller checked the alignment), the tail by
// store_n. The sweep reads only cache (the row's scratch, or its inputs again), so it prefetches
// the next row's inputs next_a / next_b (null: none), one line per 64 bytes (Note [row prefetch]).
template <class T> inline constexpr const T* kNone = nullptr;  // no row to prefetch

template <bool kStream, class T, class Value>
HWY_INLINE void write_row(T* out, int64_t n, const T* next_a, const T* next_b, Value&& value) {
  const int64_t lanes = int64_t(hn::Lanes(DF()));
  constexpr int64_t kLine = 64 / int64_t(sizeof(T));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    if (i % kLine == 0) {
      if (next_a) hwy::Prefetch(next_a + i);
      if (next_b) hwy::Prefetch(next_b + i);
    }
    store<kStream>(value(i, size_t(lanes)), out + i);
  }
  if (i < n) store_n(value(i, size_t(n - i)), out + i, size_t(n - i));
}

// softmax of one row; `scratch` holds n f32 (+ one vector), `block_max` one float per block.
// Lanes [0, count) of v, -inf elsewhere (tails of max reductions).
HWY_INLINE VF mask_tail_neg_inf(VF v, size_t count) {
  const DF d;
  if (HWY_LIKELY(count == hn::Lanes(d))) return v;
  return hn::IfThenElse(hn::FirstN(d, count), v, hn::Set(d, kNegInf));
}

// dst[i] = f(src[i]) widened to f32 for i < n; returns the max of the stored values. f maps a VF
// to a VF (identity, or a softcap).
template <class T, class F> HWY_INLINE float widen_max(const T* src, float* dst, int64_t n, F&& f) {
  const DF d;
  VF m0 = hn::Set(d, kNegInf), m1 = m0;
  const int64_t lanes = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const VF a = f(load(src + i)), b = f(load(src + i + lanes));
    store(a, dst + i);
    store(b, dst + i + lanes);
    m0 = hn::Max(m0, a);
    m1 = hn::Max(m1, b);
  }
  for (; i < n; i += lanes) {
    const size_t count = size_t(std::min(lanes, n - i));
    const VF a = f(load_n(src + i, count));
    store_n(a, dst + i, count);
    m0 = hn::Max(m0, mask_tail_neg_inf(a, count));
  }
  return hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
}

// Sum of exp(v[i] - m) for i < n; with kStore the exponentials replace v.
template <bool kStore> HWY_INLINE float sum_exp(float* v, int64_t n, float m) {
  const DF d;
  const VF vm = hn::Set(d, m);
  return sum_over(n, [&](int64_t i, size_t count, VF& acc) {
    VF e = exp_bounded(hn::Sub(load_n(v + i, count), vm));
    if (count != hn::Lanes(d)) e = hn::IfThenElseZero(hn::FirstN(d, count), e);
    if constexpr (kStore) store_n(e, v + i, count);
    acc = hn::Add(acc, e);
  });
}

// Running (max, sum of exp(v - max)) of Note [online softmax blocks].
// The sum is kept in double: each block's f32 sum is short (one L1 block), and adding the blocks
// in double keeps the row's sum to f32 precision however long the row is.
struct OnlineMaxSum {
  float max = kNegInf;
  double sum = 0;

  // Folds in a block whose max is block_max; returns false when the row so far is all -inf
  // (nothing to sum yet).
  bool raise_to(float block_max) {
    if (block_max > max) {
      sum = max == kNegInf ? 0.0 : sum * std::exp(double(max) - double(block_max));
      max = block_max;
    }
    return max != kNegInf;
  }
  float lse() const { return float(double(max) + std::log(sum)); }
};

// Sum over a row in blocks: sum_over (two f32 vector accumulators) per block of `block`
// elements, the blocks added in double. term(i, count, acc) as in sum_over, i from the row start.
template <class Term> HWY_INLINE double sum_blocks(int64_t n, int64_t block, Term&& term) {
  double total = 0;
  for (int64_t b0 = 0; b0 < n; b0 += block)
    total += sum_over(std::min(block, n - b0),
                      [&](int64_t i, size_t count, VF& acc) { term(b0 + i, count, acc); });
  return total;
}

template <class Term>
HWY_INLINE std::pair<double, double> sum_blocks2(int64_t n, int64_t block, Term&& term) {
  double a = 0, b = 0;
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const auto [pa, pb] = sum_over2(std::min(block, n - b0), [&](int64_t i, size_t count, VF& x,
                                                                  VF& y) { term(b0 + i, count, x, y); });
    a += pa;
    b += pb;
  }
  return {a, b};
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
