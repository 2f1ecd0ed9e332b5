// Note [row gather] (gather.h): the streaming row copy, one Highway source with runtime dispatch.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/gather.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstring>

#include "backends/cpu/gather.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#ifndef OPFORGE_CPU_GATHER_INDEX_ONCE  // once, though foreach_target includes this file per target
#define OPFORGE_CPU_GATHER_INDEX_ONCE
namespace opforge::cpu {
inline int64_t gather_index_at(const RowGather& g, int64_t i) {
  return g.index_i64 ? static_cast<const int64_t*>(g.index)[i] : int64_t(static_cast<const int32_t*>(g.index)[i]);
}
}  // namespace opforge::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void gather_rows_streaming(const RowGather& g, int64_t begin, int64_t end) {
  const hn::ScalableTag<uint8_t> d;
  const int64_t n = int64_t(hn::Lanes(d)), bytes = g.row_bytes;
  for (int64_t i = begin; i < end; ++i) {
    const auto* from = reinterpret_cast<const uint8_t*>(g.src + gather_index_at(g, i) * g.src_stride);
    auto* to = reinterpret_cast<uint8_t*>(g.dst + i * g.dst_stride);
    const auto* next = i + 1 < end ? reinterpret_cast<const uint8_t*>(g.src + gather_index_at(g, i + 1) * g.src_stride) : from;
    int64_t j = 0;
    for (; j + 4 * n <= bytes; j += 4 * n) {  // four loads in flight before the stores
      for (int64_t k = 0; k < 4 * n; k += 64) hwy::Prefetch(next + j + k);
      const auto v0 = hn::LoadU(d, from + j), v1 = hn::LoadU(d, from + j + n);
      const auto v2 = hn::LoadU(d, from + j + 2 * n), v3 = hn::LoadU(d, from + j + 3 * n);
      hn::Stream(v0, d, to + j);
      hn::Stream(v1, d, to + j + n);
      hn::Stream(v2, d, to + j + 2 * n);
      hn::Stream(v3, d, to + j + 3 * n);
    }
    for (; j + n <= bytes; j += n) hn::Stream(hn::LoadU(d, from + j), d, to + j);
    if (j < bytes) std::memcpy(to + j, from + j, size_t(bytes - j));
  }
  hwy::FlushStream();
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::cpu {

HWY_EXPORT(gather_rows_streaming);

void gather_rows(const RowGather& g, int64_t begin, int64_t end, bool stream) {
  if (g.row_bytes <= 0 || begin >= end) return;
  if (stream) return HWY_DYNAMIC_DISPATCH(gather_rows_streaming)(g, begin, end);
  for (int64_t i = begin; i < end; ++i)
    std::memcpy(g.dst + i * g.dst_stride, g.src + gather_index_at(g, i) * g.src_stride, size_t(g.row_bytes));
}

}  // namespace opforge::cpu
#endif  // HWY_ONCE
