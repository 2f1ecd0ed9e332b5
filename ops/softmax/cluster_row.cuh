// The segment of a row that one CTA of a few-row cluster kernel holds (the softmax family's and the
// losses' cluster kernels: ops/softmax/cuda.cu, ops/loss/cuda.cu, ops/loss/cuda_ce_grad_few.cu).
// A row is one cluster of `ranks` CTAs launched side by side (blockIdx.x / ranks is the row), or
// `ranks` blocks of a plain launch (grid_row); rank r holds units [r * seg_units, min(units, (r +
// 1) * seg_units)), and its thread t the units begin + t + k * kThreads, every one of them loaded
// at once.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "ops/softmax/row_reduce.cuh"

namespace opforge::cuda::rows {

struct ClusterRow {
  unsigned rank, ranks;
  int64_t row, begin, end;  // end: one past the segment's last unit
};

__device__ __forceinline__ ClusterRow cluster_row(const cooperative_groups::cluster_group& cluster, int64_t units,
                                                  int64_t seg_units) {
  ClusterRow r;
  r.rank = cluster.block_rank(), r.ranks = cluster.num_blocks();
  r.row = int64_t(blockIdx.x) / r.ranks;
  r.begin = int64_t(r.rank) * seg_units, r.end = min(units, r.begin + seg_units);
  return r;
}

// The same segment where a row is `ranks` consecutive blocks of a plain launch (no cluster).
__device__ __forceinline__ ClusterRow grid_row(unsigned ranks, int64_t units, int64_t seg_units) {
  ClusterRow r;
  r.rank = blockIdx.x % ranks, r.ranks = ranks;
  r.row = int64_t(blockIdx.x / ranks);
  r.begin = int64_t(r.rank) * seg_units, r.end = min(units, r.begin + seg_units);
  return r;
}

// The thread's units of the segment of row x (U: UnitOf), `fill` in every lane past its end.
template <class U, int kUnits, int kThreads, class T>
__device__ __forceinline__ void load_segment(const T* x, const ClusterRow& r, float fill,
                                             typename U::Raw (&raw)[kUnits]) {
#pragma unroll
  for (int c = 0; c < kUnits; ++c) {
    const int64_t u = r.begin + threadIdx.x + int64_t(c) * kThreads;
    raw[c] = U::load_or(x + u * U::width, u < r.end, fill);
  }
}

}  // namespace opforge::cuda::rows
