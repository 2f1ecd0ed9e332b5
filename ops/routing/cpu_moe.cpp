// CPU kernel of moe_unpermute (moe.cpp registers it): moe_unpermute_cpu_run.
//
// Assumes: the op's check has run; expert_out / y f32, bf16 or f16 with unit-stride rows; the
// weights f32 [T, k] contiguous.
//
// Why it is fast: OpenMP tasks of tokens (tokens per task from capacity_block, Note [tiling]);
// per token an f32 accumulator row (L1 for hidden up to several thousand) gets acc += w * row for
// j = 0..k-1 in that order, one Highway MulAdd per vector with the row widened in registers
// (bf16: a shift; f16: the converter), at the runtime-dispatched vector width (4 / 8 / 16 lanes);
// then one rounding to y's dtype per element. Each expert row is read once, y written once.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/routing/cpu_moe.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <memory>

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"
#include "ops/routing/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::moe_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

template <class T> void combine(const MoeUnpermutePlan& p, int64_t begin, int64_t end) {
  const int64_t H = p.hidden;
  std::unique_ptr<float[]> buffer(new float[size_t(H)]);
  float* acc = buffer.get();
  const T* in = static_cast<const T*>(p.in);
  T* y = static_cast<T*>(p.y);
  const DF d;
  for (int64_t t = begin; t < end; ++t) {
    for_each_vector(H, [&](int64_t i, size_t count) { store_n(hn::Zero(d), acc + i, count); });
    for (int64_t j = 0; j < p.topk; ++j) {
      const int64_t pair = t * p.topk + j;
      const int64_t r = p.inv_i64 ? static_cast<const int64_t*>(p.inv)[pair]
                                  : int64_t(static_cast<const int32_t*>(p.inv)[pair]);
      const VF w = hn::Set(d, p.weights[pair]);
      const T* src = in + r * p.in_stride;
      for_each_vector(H, [&](int64_t i, size_t count) {
        store_n(hn::MulAdd(w, load_n(src + i, count), load_n(acc + i, count)), acc + i, count);
      });
    }
    T* dst = y + t * p.y_stride;
    for_each_vector(H, [&](int64_t i, size_t count) { store_n(load_n(acc + i, count), dst + i, count); });
  }
}

void combine_tokens(const MoeUnpermutePlan& p, int64_t begin, int64_t end) {
  switch (p.dtype) {
    case DType::bf16: combine<bf16_t>(p, begin, end); break;
    case DType::f16: combine<f16_t>(p, begin, end); break;
    default: combine<float>(p, begin, end); break;
  }
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
