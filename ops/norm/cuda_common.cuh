// Parts shared by the norm family's CUDA files (cuda.cu: forward, cuda_backward.cu: backward):
// kernel argument blocks, the register-resident row shape and the vec16 predicate pieces.
#pragma once

#include <cstdlib>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/norm/norm_cuda.h"

namespace opforge::cuda::norm {

// Arguments of the forward kernels. Plain rms_norm leaves s and r null (kFused = false).
template <class T> struct FwdArgs {
  T* y;
  T* s;
  const T* x;
  const T* r;
  const T* w;
  int64_t y_stride, s_stride, x_stride, r_stride, w_stride;  // row strides; w: element stride
  int64_t rows, hidden;
  float eps, offset;
};

// Arguments of the backward kernels. Plain rms_norm_backward leaves dr, ds and r null.
template <class T> struct BwdArgs {
  T* dx;
  T* dr;
  const T* dy;
  const T* ds;
  const T* x;
  const T* r;
  const T* w;
  int64_t dx_stride, dr_stride, dy_stride, ds_stride, x_stride, r_stride, w_stride;
  int64_t rows, hidden;
  float eps, offset;
};

// Row stride of a row tensor; a 1-D tensor is one row.
inline int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

// Note [register-resident row]: a vec16 kernel gives each row `threads` threads that each hold
// K packs of 16 bytes in registers (pack i of the row lives in thread i % threads, slot i / threads),
// so x is read from memory once. K is 1 or 2, the smaller that fits the row in `max_threads`
// (1024 forward, 512 backward, where more values stay live); a longer row goes to the scalar
// kernel (the predicates say so). K = 4 was tried: at 1024 threads (64 registers a thread) the
// 16-bit forward kernels spilled, and at 512 threads it covers no row that K = 2 does not.
struct RowShape {
  int k = 1;            // packs per thread
  int threads = 32;     // threads per row: a power of two <= 32, or a multiple of 32
  int rows_per_block = 1;
  int block = 32;
};
inline RowShape register_row_shape(int64_t n_packs, int max_threads, int group_block) {
  RowShape s;
  s.k = n_packs <= max_threads ? 1 : 2;
  int64_t per_row = (n_packs + s.k - 1) / s.k;
  if (per_row <= 32 && group_block > 0) {
    int t = 1;
    while (t < per_row) t *= 2;
    s.threads = t;
    s.block = group_block;
    s.rows_per_block = group_block / t;
  } else {
    s.threads = int((per_row + 31) / 32 * 32);
    s.block = s.threads;
    s.rows_per_block = 1;
  }
  return s;
}

// Note [rows in flight] (cuda.cu): how many rows a vec16 block step takes at once (R) and how many
// threads a row gets at most (the rest of a long row goes to a second pack per thread). Measured on
// an H200 at 16384 x 4096 bf16: rms_norm 512 threads x 4 rows (86% of copy; 1 row: 52%; from 6
// rows per SM on, Note [narrow rows] in cuda.cu takes rms_norm: 96%);
// fused_add_rms_norm 256 threads x 2 packs x 1 row (91%; 512 x 1 x 2 rows: 85%, 4 rows spill:
// 62%); the backward kernels 1 row (Note [rows in flight, backward] in cuda_backward.cu).
// Tuning runs override R with OPFORGE_CUDA_NORM_ROWS=1|2|4 and the thread cap with
// OPFORGE_CUDA_NORM_THREADS=64..1024 (forward).
inline int max_rows_at_once(bool fused, bool backward) {
  static const int forced = env_choice("OPFORGE_CUDA_NORM_ROWS", 1, 4);
  if (forced) return forced;
  if (backward) return 1;
  return fused ? 1 : 4;
}

inline constexpr int kFwdMaxThreads = 1024;  // forward: up to 2 * 1024 packs per row
inline constexpr int kBwdMaxThreads = 512;   // backward: up to 2 * 512 packs (more live values)
// fused_add_rms_norm takes 256 threads a row (two packs each at hidden 4096) from as many rows as
// SMs on, the whole row's worth below: at 16 x 4096 bf16 on an H200 (programmatic launches on)
// 1.90 us with 512 threads against 2.09 with 256, while at 1,024 and 16,384 rows 256 stays ahead
// (6.44 / 140 us against 6.96 / 151; docs/perf/gpu-h200-2026-11-27-round13.md).
inline int fwd_max_threads(bool fused, bool few_rows) {
  static const int forced = env_choice("OPFORGE_CUDA_NORM_THREADS", 64, kFwdMaxThreads);
  return forced ? forced : fused && !few_rows ? 256 : kFwdMaxThreads;
}

// Shared by the vec16 predicates: dtype, w contiguous and aligned, hidden a multiple of the pack.
inline const char* vec16_common_problem(const TensorView& x, const TensorView& w, int64_t max_packs) {
  if (!is_cuda_float(x.dtype)) return kNotCudaFloat;
  const int64_t n = 16 / x.itemsize();
  const int64_t hidden = x.size(-1);
  if (hidden % n != 0) return n == 8 ? "hidden % 8 != 0" : "hidden % 4 != 0";
  if (hidden / n > max_packs)
    return max_packs == 2 * kFwdMaxThreads ? "hidden exceeds a register-resident row (2048 packs)"
                                           : "hidden exceeds a register-resident row (1024 packs)";
  if (w.stride(0) != 1 && hidden > 1) return "w is not contiguous";
  if (!aligned16(w.data)) return "w is not 16-byte aligned";
  return nullptr;
}

// s = x + residual rounded to T, as fused_add_rms_norm stores it. The backward recomputes s with
// this same function, so both see the same bits.
template <class T>
__device__ __forceinline__ Pack<T> rounded_sum(const Pack<T>& x, const Pack<T>& r) {
  PackFloats<T> s = widen_pack(x);
  const PackFloats<T> fr = widen_pack(r);
#pragma unroll
  for (int j = 0; j < Pack<T>::n; ++j) s.v[j] += fr.v[j];
  return narrow_pack(s);
}

}  // namespace opforge::cuda::norm
