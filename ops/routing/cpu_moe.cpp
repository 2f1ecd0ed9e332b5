// CPU kernel of moe_unpermute (moe.cpp registers it): moe_unpermute_cpu_run.
//
// Assumes: the op's check has run; expert_out / y f32, bf16 or f16 with unit-stride rows; the
// weights f32 [T, k] contiguous.
//
// Why it is fast: OpenMP tasks of tokens (tokens per task from capacity_block, Note [tiling]).
// A token's output is taken four vectors of columns at a time, each an f32 accumulator in a
// register: acc = 0, then acc += w_j * row_j for j = 0..k-1 in that order (one Highway MulAdd per
// vector, the row widened in registers: bf16 a shift, f16 the converter), then one rounding to
// y's dtype. Each expert row is read once and y written once, with no f32 row in memory between
// them (a row accumulator in L1 cost a load and a store of it per expert row), and four
// independent FMA chains hide the FMA's latency. Past the cache share y goes out by streaming
// stores (Note [streaming stores]); the next token's expert rows are prefetched, their first
// lines, while this one is summed (they sit at scattered places of expert_out).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/routing/cpu_moe.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <memory>

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"
#include "ops/routing/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::moe_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

template <bool kStream, class T> void combine(const MoeUnpermutePlan& p, int64_t begin, int64_t end) {
  const int64_t H = p.hidden, K = p.topk;
  std::unique_ptr<const T*[]> rows(new const T*[size_t(K)]);
  const T* in = static_cast<const T*>(p.in);
  const DF d;
  const int64_t lanes = int64_t(hn::Lanes(d)), step = 4 * lanes;
  auto row_of = [&](int64_t pair) {
    const int64_t r = p.inv_i64 ? static_cast<const int64_t*>(p.inv)[pair]
                                : int64_t(static_cast<const int32_t*>(p.inv)[pair]);
    return in + r * p.in_stride;
  };
  for (int64_t t = begin; t < end; ++t) {
    for (int64_t j = 0; j < K; ++j) rows[size_t(j)] = row_of(t * K + j);
    if (t + 1 < end)
      for (int64_t j = 0; j < K; ++j) hwy::Prefetch(row_of((t + 1) * K + j));
    const float* w = p.weights + t * K;
    T* dst = static_cast<T*>(p.y) + t * p.y_stride;
    int64_t i = 0;
    for (; i + step <= H; i += step) {
      VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t j = 0; j < K; ++j) {
        const VF wj = hn::Set(d, w[j]);
        const T* src = rows[size_t(j)] + i;
        a0 = hn::MulAdd(wj, load(src), a0);
        a1 = hn::MulAdd(wj, load(src + lanes), a1);
        a2 = hn::MulAdd(wj, load(src + 2 * lanes), a2);
        a3 = hn::MulAdd(wj, load(src + 3 * lanes), a3);
      }
      store<kStream>(a0, dst + i);
      store<kStream>(a1, dst + i + lanes);
      store<kStream>(a2, dst + i + 2 * lanes);
      store<kStream>(a3, dst + i + 3 * lanes);
    }
    for (; i < H; i += lanes) {
      const size_t count = size_t(std::min(lanes, H - i));
      VF a = hn::Zero(d);
      for (int64_t j = 0; j < K; ++j) a = hn::MulAdd(hn::Set(d, w[j]), load_n(rows[size_t(j)] + i, count), a);
      store_n(a, dst + i, count);
    }
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <bool kStream> void combine_typed(const MoeUnpermutePlan& p, int64_t begin, int64_t end) {
  switch (p.dtype) {
    case DType::bf16: combine<kStream, bf16_t>(p, begin, end); break;
    case DType::f16: combine<kStream, f16_t>(p, begin, end); break;
    default: combine<kStream, float>(p, begin, end); break;
  }
}

void combine_tokens(const MoeUnpermutePlan& p, int64_t begin, int64_t end) {
  if (p.stream) combine_typed<true>(p, begin, end);
  else combine_typed<false>(p, begin, end);
}

}  // namespace opforge::moe_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace moe_cpu {
HWY_EXPORT(combine_tokens);
}  // namespace moe_cpu

void moe_unpermute_cpu_run(const MoeUnpermutePlan& p) {
  if (p.tokens == 0 || p.hidden == 0) return;
  // Note [tiling]: a task's k input rows and its output row fill half of a core's L2.
  cpu::TileSpec spec;
  spec.bytes_per_element = (p.topk + 1) * dtype_size(p.dtype);
  spec.multiplier = p.hidden;
  const cpu::RowTasks tasks = cpu::balanced(cpu::row_blocks(p.tokens, spec));  // Note [balanced tasks]
  auto* fn = HWY_DYNAMIC_DISPATCH(moe_cpu::combine_tokens);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { fn(p, tasks.begin(t), tasks.end(t)); });
}

}  // namespace opforge
#endif  // HWY_ONCE
