// The launch plan of the norm family's few-row backward clusters (Note [few-row backward cluster],
// ops/norm/cuda_backward.cu; layer_norm_backward's cluster takes it too): plain host arithmetic,
// so that the tests check it on any machine.
#pragma once

#include <algorithm>
#include <cstdint>

namespace opforge::cuda::norm {

inline constexpr int kClusterCtas = 16;         // the most: a non-portable cluster size of sm_90
inline constexpr int kClusterPortableCtas = 8;  // the portable cluster size limit
inline constexpr int kClusterMaxThreads = 1024;
inline constexpr int kClusterMaxRows = 2 * (kClusterMaxThreads / 32);  // RT <= 2, G <= 32

// CTA c of the cluster owns the packs [c * packs, (c + 1) * packs) of every row; its threads form
// `groups` row groups of `padded` threads (packs rounded up to a warp), thread (g, p) holding pack
// p of rows g, g + groups, ... (`rows_per_thread` of them). ranks == 0: the plan does not apply
// (more than 2 rows a thread, or a row too long for the CTAs of 1024 threads). Up to `most_ranks`
// CTAs, as many as leave each a warp's width of packs.
struct ClusterPlan {
  int ranks = 0, packs = 0, padded = 0, groups = 0, rows_per_thread = 0;
};
inline ClusterPlan bwd_cluster_plan(int64_t rows, int64_t n_packs, int most_ranks = kClusterPortableCtas) {
  ClusterPlan c;
  int ranks = most_ranks;
  while (ranks > 1 && n_packs < int64_t(ranks) * 32) ranks /= 2;  // a warp's width of packs a CTA
  const int64_t packs = (n_packs + ranks - 1) / ranks, padded = (packs + 31) / 32 * 32;
  if (rows < 1 || padded > kClusterMaxThreads) return c;
  const int64_t groups = std::min<int64_t>(rows, kClusterMaxThreads / padded);
  const int64_t rt = (rows + groups - 1) / groups;
  if (rt > 2) return c;
  c.ranks = ranks, c.packs = int(packs), c.padded = int(padded), c.groups = int(groups), c.rows_per_thread = int(rt);
  return c;
}

// Rows from which the clusters may take 16 CTAs (fitting_cluster_plan, cuda_backward.cuh).
inline constexpr int64_t kWideClusterMinRows = 8;

}  // namespace opforge::cuda::norm
