// The launch plan of the softmax family's few-row clusters (Note [few-row softmax cluster],
// ops/softmax/cuda.cu): plain host arithmetic, so that the tests check it on any machine.
#pragma once

#include <cstdint>

namespace opforge::cuda::softmax {

inline constexpr int kClusterThreads = 256;  // threads of a cluster CTA

// The cluster size for `units_per_thread` units a thread and at most `max_ranks` CTAs, or 0: the
// fewest CTAs that hold the row, doubled while the rows' CTAs stay within the SM count and every
// thread keeps at least one unit; at least 2 (a row one CTA holds whole and no SMs to spread it
// over goes to the row kernel).
inline int cluster_ranks(int64_t rows, int64_t units, int sms, int units_per_thread, int max_ranks) {
  const int64_t per_cta = int64_t(kClusterThreads) * units_per_thread;
  int ranks = 1;
  while (ranks < max_ranks && ranks * per_cta < units) ranks *= 2;
  if (ranks * per_cta < units) return 0;
  while (ranks < max_ranks && rows * ranks * 2 <= sms && units >= int64_t(ranks) * 2 * kClusterThreads) ranks *= 2;
  return ranks < 2 ? 0 : ranks;
}

// Units a thread (4 or 8) and CTAs a row of the few-row cluster, or {0, 0} when it does not take
// the call (as many rows as SMs, or a row longer than 8 CTAs of 8 units a thread hold). With
// `four_units`: 4 units a thread wherever up to 8 CTAs hold the row, or 16 CTAs when the rows'
// 16 CTAs fit two an SM (rows * 16 <= 2 * sms); else 8 units on up to 8 CTAs. Two 4-unit CTAs
// an SM give each scheduler four warps where one 8-unit CTA gave it two for the same values:
// H200, bf16, 16 x 128,256, 16 CTAs of 4 units against 8 of 8, us: softmax 5.38 -> 4.79,
// log_softmax 5.49 -> 4.92, softmax_backward 5.06 -> 4.97, log_softmax_backward 5.01 -> 4.95,
// cross_entropy's gather 4.91 -> 4.75 (docs/perf/gpu-h200-2026-12-02-round38.md).
struct FewRowPlan {
  int units_per_thread = 0, ranks = 0;
};
inline FewRowPlan few_row_plan(int64_t rows, int64_t units, int sms, bool four_units) {
  if (rows < 1 || rows >= sms) return {};
  if (four_units) {
    const int max_ranks = rows * 16 <= 2 * int64_t(sms) ? 16 : 8;
    if (const int ranks = cluster_ranks(rows, units, sms, 4, max_ranks)) return {4, ranks};
  }
  if (const int ranks = cluster_ranks(rows, units, sms, 8, 8)) return {8, ranks};
  return {};
}

// The units a thread of a few-row plan's CTA is instantiated for: 2 where they cover the CTA's
// segment of a row of `units` (so no thread carries dead units through the math: H200, bf16
// cross_entropy 16 x 32,000 3.96 -> 3.76 us, docs/perf/gpu-h200-2026-12-02-round37.md), else the
// plan's 4 or 8. Taken by the losses' few-row kernels (ops/loss/cuda.cu, cuda_ce_grad_few.cu).
inline int held_units(const FewRowPlan& plan, int64_t units) {
  const int64_t segment = (units + plan.ranks - 1) / plan.ranks;
  return segment <= 2 * int64_t(kClusterThreads) ? 2 : plan.units_per_thread;
}

// Note [many-row cluster]: with at least as many rows as SMs, a row is one cluster only where it
// is longer than the row kernel keeps in registers (more than `cached_units` units): on the
// fewest CTAs that hold it, 4 units a thread where up to 8 CTAs do and `four_units`, else 8 units
// on up to 8 CTAs; {0, 0} otherwise (a row that fits the row kernel's registers, or one longer
// than 8 CTAs of 8 units hold). The row is then read from memory once, every load of a thread
// issued at once, where the row kernel streamed what its registers missed and read it again for
// the output. H200, bf16, same binary with OPFORGE_CUDA_MANY_ROW_CLUSTERS=0 against the plan, us:
// softmax_backward 1,024 x 32,000 77.3 -> 48.2 (61% -> 98% of copy), 256 x 128,256 100.9 -> 52.2
// (47% -> 90%); log_softmax_backward 79.1 -> 48.8 and 105.6 -> 55.8; softmax 58.2 -> 42.0
// and 89.4 -> 49.9; log_softmax 52.9 -> 42.7 and 84.4 -> 50.4 (docs/perf/gpu-h200-2026-11-30-round28.md).
// cross_entropy's forward does not take it (ops/loss/cuda.cu: 2x slower than its row kernel there).
inline FewRowPlan many_row_plan(int64_t rows, int64_t units, int sms, int64_t cached_units, bool four_units = true) {
  if (rows < sms || units <= cached_units) return {};
  if (const int ranks = four_units ? cluster_ranks(rows, units, sms, 4, 8) : 0) return {4, ranks};
  if (const int ranks = cluster_ranks(rows, units, sms, 8, 8)) return {8, ranks};
  return {};
}

// Note [softmax row pipeline] (ops/softmax/cuda_pipeline.cu): a row on `ranks` CTAs (1, 2, 4 or 8;
// a cluster when more than one) whose segments of `seg_units` 16-byte packs stream through a ring
// of `stages` shared-memory buffers a CTA. The fewest CTAs whose segment the CTA's threads hold
// (threads x units_per_thread packs) and whose ring has at least two stages in `smem_bytes` (the
// most dynamic shared memory a block may take), at most kPipelineMaxStages (2: H200, 1,024 x 32,000,
// one CTA a row, two calls, bf16 softmax 39.5 / 39.8 us with 3 stages, 39.2 / 39.0 with 2; f16
// 39.8 / 39.7 -> 38.7 / 38.6; log_softmax likewise; f32 256 x 128,256 the same, 116.8 / 117.4;
// OPFORGE_CUDA_SOFTMAX_PIPELINE_STAGES=2..4 overrides it, tuning). {0, 0, 0} for fewer
// rows than SMs, a row the row kernel holds (`cached_units` packs or fewer), one no 8 CTAs hold,
// and one that needs a cluster while the many-row cluster holds it (`cluster_units` packs or
// fewer), which measured faster there: H200, bf16 256 x 128,256 (4 CTAs a row) 57.6 us against
// 49.6, f32 1,024 x 32,000 (2 CTAs) 100.4 against 95.0 (docs/perf/gpu-h200-2026-11-30-round30.md).
inline constexpr int kPipelineMaxStages = 2;
struct PipelinePlan {
  int ranks = 0, stages = 0;
  int64_t seg_units = 0;
};
inline PipelinePlan pipeline_plan(int64_t rows, int64_t units, int sms, int64_t cached_units, int64_t cluster_units,
                                  int64_t smem_bytes, int threads, int units_per_thread) {
  if (rows < sms || units <= cached_units) return {};
  for (int ranks = 1; ranks <= 8; ranks *= 2) {
    const int64_t seg = (units + ranks - 1) / ranks;
    if (seg > int64_t(threads) * units_per_thread) continue;
    const int64_t stages = smem_bytes / (seg * 16);
    if (stages < 2) continue;
    if (ranks > 1 && units <= cluster_units) return {};
    return {ranks, int(stages < kPipelineMaxStages ? stages : kPipelineMaxStages), seg};
  }
  return {};
}
}  // namespace opforge::cuda::softmax
