// Device helpers shared by the attention_prefill CUDA kernels (cuda_prefill.cu,
// cuda_prefill_backward.cu): the sequence of a token and the mask of Note [attention mask] on
// global token indices.
//
// cu_seqlens lives on the device beside q, so the host never reads it (no synchronization). A
// token t finds its sequence [start, end) by a binary search over cu_seqlens (the last b with
// cu[b] <= t). Query i then sees the global keys j with lo_i <= j < hi_i where
//   lo_i = max(start, i - window_left)   (window_left < 0: start)
//   hi_i = causal ? i + 1 : end,
// and key j is seen by the queries i with qlo_j <= i < qhi_j where
//   qlo_j = causal ? j : start,   qhi_j = window_left < 0 ? end : min(end, j + window_left + 1).
// Query and key lengths are equal, so the within-sequence rule (j <= i, j >= i - window_left) is
// the same rule on global indices. The offsets are clamped (start into [0, t], end into [t + 1, T]),
// so whatever the device holds no index leaves [0, T), every query sees key i (its softmax is
// defined) and every key is seen by query j.
#pragma once

#include <cstdint>

#include "opforge/op.h"

namespace opforge::cuda::attention_prefill {

struct Seqs {
  const void* cu;     // cu_seqlens on the device
  int64_t cu_stride;  // elements between offsets
  bool is64;          // int64 offsets (else int32)
  int64_t batch;      // B = numel - 1
  int64_t tokens;     // T
};

inline Seqs seqs_of(const TensorView& cu, int64_t tokens) {
  Seqs s{};
  s.cu = cu.data;
  s.cu_stride = cu.numel() > 1 ? cu.stride(0) : 1;
  s.is64 = cu.dtype == DType::i64;
  s.batch = cu.numel() - 1;
  s.tokens = tokens;
  return s;
}

__device__ __forceinline__ int64_t load_cu(const Seqs& s, int64_t b) {
  return s.is64 ? static_cast<const int64_t*>(s.cu)[b * s.cu_stride]
                : int64_t(static_cast<const int32_t*>(s.cu)[b * s.cu_stride]);
}

struct Range {
  int64_t lo, hi;  // [lo, hi)
};

// The clamped sequence [start, end) of token 0 <= t < T; start <= t < end.
__device__ __forceinline__ Range sequence_of(const Seqs& s, int64_t t) {
  int64_t start = 0, end = s.tokens;
  if (s.batch >= 1) {
    int64_t lo = 0, hi = s.batch - 1;  // the last b in [0, B) with cu[b] <= t
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (load_cu(s, mid) <= t) lo = mid;
      else hi = mid - 1;
    }
    start = load_cu(s, lo);
    end = load_cu(s, lo + 1);
  }
  start = start < 0 ? 0 : (start > t ? t : start);
  end = end > s.tokens ? s.tokens : (end < t + 1 ? t + 1 : end);
  return {start, end};
}

// The keys query i sees.
__device__ __forceinline__ Range key_range(const Seqs& s, int64_t i, bool causal, int64_t window_left) {
  const Range seq = sequence_of(s, i);
  int64_t first = seq.lo;
  if (window_left >= 0 && i - window_left > first) first = i - window_left;
  return {first, causal ? i + 1 : seq.hi};
}

// The queries that see key j.
__device__ __forceinline__ Range query_range(const Seqs& s, int64_t j, bool causal, int64_t window_left) {
  const Range seq = sequence_of(s, j);
  int64_t last = seq.hi;  // exclusive
  if (window_left >= 0 && j + window_left + 1 < last) last = j + window_left + 1;
  return {causal ? j : seq.lo, last};
}

}  // namespace opforge::cuda::attention_prefill
