// CUDA kernels of fused_linear_cross_entropy and its backward (Note [flce semantics], linear.h).
//
// Assumes: f32 / f16 / bf16 (f64 goes to the reference), Note [row layout] for hidden, w,
// dhidden, dw (padded rows are leading dimensions), target int64 on the device (values not
// range-checked: a target outside [0, V) other than ignore_index gives NaN, as cross_entropy's
// CUDA kernels), the op's check has run.
//
// Technique. The [tokens, V] logits never exist: they are produced one block of `rows` tokens x
// `cols` vocabulary columns at a time (Note [flce cuda blocks]) by one cuBLASLt GEMM
// (cuda::lt::matmul, ops/linear/cublaslt.cuh: the linear op's handle and algorithm cache; A/B in
// the input dtype, D in f32, f32 accumulation; with a bias the block is first filled with b and
// the product added with beta = 1), so the logits are never rounded to the input dtype.
//  - Forward: for each token block, the vocabulary blocks go by in order and one warp per row
//    folds each into the row's running (max, sum of exp, sum of z) and picks z[target] when the
//    target falls in the block (online log-sum-exp, merged in a fixed order). A last pass per
//    row writes lse (for every token) and the loss. Long vocabulary blocks keep the GEMMs'
//    M = rows large (all 8,192 tokens of a training step at once), where cuBLASLt runs near peak.
//  - Backward: the forward's lse makes the gradient of a block local: G = g (exp(z - lse) -
//    (1 - ls) [v == t] - ls / V) needs nothing from other blocks. So the vocabulary is the inner
//    loop: per block, the logits GEMM, one element-wise pass that writes G (in the input dtype
//    for f16 / bf16: cuBLASLt multiplies operands of one dtype) and each column's partial sum per
//    64-row group, then
//      dw[v0 .. v0 + cols) (+)= G^T . hidden_block   (k = rows; beta 0 for the first token block),
//      dhidden_block (+)= G . w[v0 .. v0 + cols)     (k = cols; f32 accumulator for 16-bit),
//    and db's accumulator adds the column partials in a fixed order. Each dw slice is written once
//    per token block (once in all when every token fits one block), with f32 sums of the block's
//    whole k; dhidden is accumulated in f32 across vocabulary blocks and rounded once.
// The per-token losses of sum / mean are added by Note [loss row reduction] (one block, fixed
// order, on the device: no host synchronization; mean of zero counted tokens is 0). Everything
// lives in the stream's workspace (Note [cuda workspace]): no allocation after the first call of
// a shape. Shapes for which cuBLASLt has no algorithm (or K = 0) take a tiled GEMM
// (tiled_gemm.cuh: 64 x 64 tiles, f32 sums, any strides) instead. Deterministic: fixed-order
// reductions, cached algorithms, blocks in order.
//
// Note [flce cuda blocks]: with s the input dtype's size, a call's workspace is
//   32 MiB (cuBLASLt) + rows x ld x e (the block; ld = cols rounded up to 8) + rows x r
//   + 4 V (db accumulator, backward) + 4 tokens (per-token losses, reduced forward),
// e = 4 (f32 logits) in the forward and 4 + s (G in the input dtype, 16-bit only) + 1 (column
// partials) in the backward; r = 16 (running row statistics) in the forward and 4 H (the f32
// dhidden accumulator, 16-bit only) in the backward. The budget is tokens x V x s / 8 (1/8 of the
// logits in the input dtype) rounded down to a multiple of 8 MiB (the step in which the backend
// grows a workspace above 64 MiB, Note [cuda workspace]) less 8 MiB (the stream's other
// device memory, e.g. a grid barrier's 2 MiB allocation), and at least 64 MiB (small problems:
// under about 2,100 tokens at V = 128,256 in bf16 the eighth is smaller than cuBLASLt's 32 MiB
// plus a useful block, and these floors dominate). rows: the fewest equal token blocks
// (multiples of 64, or all tokens) such that a block with 2,048 columns fits the budget; cols:
// the most columns (a multiple of 128, at most V) the budget then leaves. At 8,192 tokens x
// 4,096 -> 128,256 in bf16 the eighth is 250.5 MiB and the budget 240 MiB: the forward takes all
// 8,192 tokens x 6,528 columns (236 MiB), the backward two blocks of 4,096 tokens x 5,248
// columns (221 MiB). flce_cuda_plan() tells the plan of a shape, flce_cuda_last_workspace_bytes()
// a call's figure. OPFORGE_CUDA_FLCE_BLOCK = "ROWSxCOLS" forces a block (tests use it to cover
// many blocks at small sizes; the memory bound then does not apply).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/linear/cublaslt.cuh"
#include "ops/linear/flce_gemm.cuh"
#include "ops/linear/linear_cuda.h"
#include "ops/loss/loss_cuda.cuh"
#include "ops/loss/loss_cuda.h"
#include "ops/softmax/row_reduce.cuh"

namespace opforge {
namespace cuda::flce {
namespace {

thread_local int64_t last_workspace_bytes = 0;

// ---- the plan of a call -----------------------------------------------------------------------------

constexpr int64_t kAlign = 256;
constexpr int kGroupRows = 64;          // rows of one column-partial group (backward)
constexpr int64_t kTargetCols = 2048;   // a block at least this wide decides the token rows
constexpr int64_t kFloorBudget = int64_t(64) << 20;   // small problems: 32 MiB of cuBLASLt + 32 of blocks
constexpr int64_t kBudgetStep = int64_t(8) << 20;
constexpr int64_t kFloorBlockBytes = int64_t(32) << 20;
int64_t up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Byte offsets in the workspace, after cuBLASLt's share, each region aligned.
struct Layout {
  int64_t at = up(lt::kWorkspaceBytes);
  int64_t take(int64_t bytes) {
    const int64_t off = at;
    at += up(std::max<int64_t>(bytes, 0));
    return off;
  }
};

struct Plan {
  int64_t tokens = 0, h = 0, vocab = 0;
  int64_t rows = 0, cols = 0, ld = 0;  // a block: rows x cols, row stride ld (elements)
  bool g16 = false;
  // byte offsets in the workspace
  int64_t logits = 0, g = 0, partial = 0, dh_acc = 0, stats = 0, row_loss = 0, db_acc = 0, scalars = 0, total = 0;
};

// OPFORGE_CUDA_FLCE_BLOCK = "ROWSxCOLS": a forced block (0 when unset or malformed).
void forced_block(int64_t* rows, int64_t* cols) {
  *rows = *cols = 0;
  const char* env = std::getenv("OPFORGE_CUDA_FLCE_BLOCK");
  long long r = 0, c = 0;
  if (env != nullptr && std::sscanf(env, "%lldx%lld", &r, &c) == 2 && r > 0 && c > 0) *rows = r, *cols = c;
}

// The eighth of the logits rounded down to the workspace's allocation step above 64 MiB (8 MiB:
// Note [cuda workspace]), so what the backend allocates for a plan within the budget stays within
// it, less one step for the backend's other allocations on the stream (the 2 MiB of a grid barrier).
int64_t budget_of(int64_t tokens, int64_t vocab, int64_t itemsize) {
  const double eighth = double(tokens) * double(vocab) * double(itemsize) / 8.0;
  return std::max(kFloorBudget, (int64_t(eighth / double(kBudgetStep)) - 1) * kBudgetStep);
}

// Note [flce cuda blocks].
Plan plan_for(int64_t tokens, int64_t h, int64_t vocab, DType dtype, bool backward, bool reduced_forward) {
  const int64_t s = dtype_size(dtype);
  Plan p;
  p.tokens = tokens, p.h = h, p.vocab = vocab;
  p.g16 = backward && dtype != DType::f32;
  const int64_t per_elem = backward ? 4 + (p.g16 ? s : 0) + 1 : 4;
  const int64_t per_row = backward ? (p.g16 ? 4 * h : 0) : 16;
  const int64_t fixed = lt::kWorkspaceBytes + (backward ? 4 * vocab : 0) + (reduced_forward ? 4 * tokens : 0) + 16 * kAlign;
  const int64_t avail = budget_of(tokens, vocab, s) - fixed;
  const int64_t max_rows = avail > 0 ? avail / (per_row + kTargetCols * per_elem) / 64 * 64 : 0;
  const int64_t all = std::max<int64_t>(tokens, 1);
  int64_t rows = 0, cols = 0;
  if (max_rows >= 64) {
    const int64_t blocks = ceil_div(all, max_rows);
    rows = std::min(all, ceil_div(ceil_div(all, blocks), 64) * 64);
    cols = (avail - rows * per_row) / (rows * per_elem) / 128 * 128;
  } else {  // a very wide hidden: 64 rows and the columns a floor block holds
    rows = std::min<int64_t>(all, 64);
    cols = std::max<int64_t>(256, kFloorBlockBytes / (rows * per_elem) / 128 * 128);
  }
  int64_t forced_rows = 0, forced_cols = 0;
  forced_block(&forced_rows, &forced_cols);
  if (forced_rows > 0) rows = forced_rows, cols = forced_cols;
  p.rows = std::max<int64_t>(1, std::min(rows, tokens));
  p.cols = std::max<int64_t>(1, std::min(cols, vocab));
  p.ld = ceil_div(p.cols, 8) * 8;
  Layout layout;
  auto take = [&](int64_t bytes) { return layout.take(bytes); };
  p.logits = take(p.rows * p.ld * 4);
  p.g = take(p.g16 ? p.rows * p.ld * s : 0);
  p.partial = take(backward ? ceil_div(p.rows, kGroupRows) * p.ld * 4 : 0);
  p.dh_acc = take(p.g16 ? p.rows * h * 4 : 0);
  p.stats = take(backward ? 0 : 4 * p.rows * 4);
  p.row_loss = take(reduced_forward ? tokens * 4 : 0);
  p.db_acc = take(backward ? vocab * 4 : 0);
  p.scalars = take(2 * 4);
  p.total = layout.at;
  return p;
}

// Note [flce with grad]: fused_linear_cross_entropy_with_grad computes a token block's logits once
// when the block can hold its whole rows: rows x ld f32 logits (the gradient in the input dtype is
// written over them, row by row, by ce_grad_rows), ceil(rows / 64) x ld f32 column partials, 4 V
// (db accumulator) and 4 tokens (per-token losses, sum / mean) in the budget of Note [flce cuda
// blocks]. rows: all tokens when they fit, else the fewest equal blocks of a multiple of 64 rows;
// 0 when not even 64 rows (or all tokens, if fewer) fit, or a forced block has fewer columns than
// V: the call then runs the forward and the backward (logits twice). At 8,192 x 4,096 -> 128,256
// in bf16: 22 blocks of 384 tokens (the last 128), 201 MiB of blocks in a 240 MiB budget.
Plan with_grad_plan_for(int64_t tokens, int64_t h, int64_t vocab, DType dtype, bool reduced) {
  Plan p;
  p.tokens = tokens, p.h = h, p.vocab = vocab;
  p.cols = std::max<int64_t>(vocab, 1);
  p.ld = ceil_div(p.cols, 8) * 8;
  const int64_t fixed = lt::kWorkspaceBytes + 4 * vocab + (reduced ? 4 * tokens : 0) + 16 * kAlign + 4 * p.ld;
  const int64_t avail = budget_of(tokens, vocab, dtype_size(dtype)) - fixed;
  const double per_row = double(p.ld) * (4.0 + 4.0 / double(kGroupRows));
  const int64_t max_rows = avail > 0 ? int64_t(double(avail) / per_row) : 0;
  const int64_t all = std::max<int64_t>(tokens, 1);
  if (max_rows >= all) {
    p.rows = all;
  } else if (max_rows >= 64) {
    const int64_t blocks = ceil_div(all, max_rows / 64 * 64);
    p.rows = std::min(all, ceil_div(ceil_div(all, blocks), 64) * 64);
  }
  int64_t forced_rows = 0, forced_cols = 0;
  forced_block(&forced_rows, &forced_cols);
  if (forced_rows > 0) p.rows = forced_cols < vocab ? 0 : std::min(forced_rows, all);
  if (p.rows == 0) return p;
  Layout layout;
  auto take = [&](int64_t bytes) { return layout.take(bytes); };
  p.logits = take(p.rows * p.ld * 4);
  p.partial = take(ceil_div(p.rows, kGroupRows) * p.ld * 4);
  p.row_loss = take(reduced ? tokens * 4 : 0);
  p.db_acc = take(vocab * 4);
  p.scalars = take(2 * 4);
  p.total = layout.at;
  return p;
}

// ---- element-wise and row kernels ---------------------------------------------------------------------

// logits[r, c] = b[v0 + c] for a rows x cols block (row stride ld).
template <class T>
__global__ void bias_fill_kernel(float* logits, int64_t rows, int64_t cols, int64_t ld, const T* b, int64_t v0) {
  const int64_t count = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    logits[(i / cols) * ld + i % cols] = to_f32(b[v0 + i % cols]);
}

// Running statistics of one row over the vocabulary blocks seen so far.
struct RowState {
  float* max;      // [rows]
  float* sum;      // sum of exp(z - max)
  float* sum_z;    // sum of z (label smoothing)
  float* z_target; // z[target] once its block has passed; NaN before (and for targets out of range)
};

struct MergeArgs {
  const float* logits;
  int64_t ld, rows, cols, v0, n0;
  const int64_t* target;
  int64_t target_stride, ignore_index;
  RowState st;
  bool first;
};

// One warp per row: fold the block's columns into the row's state (online log-sum-exp with the
// softmax kernels' statistics: cuda::rows::add_unit, merge, row_stats).
__global__ void __launch_bounds__(256) merge_block_kernel(MergeArgs a) {
  using rows::Stats;
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (r >= a.rows) return;  // whole warps: the reductions below are warp shuffles only
  const float* z = a.logits + r * a.ld;
  Stats st{-INFINITY, 0.0f};
  float sz = 0.0f;
  // Eight columns a lane per step (two 16-byte loads in flight; ld % 8 == 0, workspace aligned).
  for (int64_t c = int64_t(lane) * 8; c < a.cols; c += 256) {
    float v[8];
    const int n = int(std::min<int64_t>(8, a.cols - c));
    if (n == 8) {
      const float4 q0 = reinterpret_cast<const float4*>(z + c)[0], q1 = reinterpret_cast<const float4*>(z + c)[1];
      v[0] = q0.x, v[1] = q0.y, v[2] = q0.z, v[3] = q0.w, v[4] = q1.x, v[5] = q1.y, v[6] = q1.z, v[7] = q1.w;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = k < n ? z[c + k] : -INFINITY;  // exp(-inf) adds nothing
    }
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < n) sz += v[k];
    st = rows::add_unit<float, 8>(st, v);
  }
  st = rows::row_stats(st, 32, nullptr);  // one warp: butterflies only, no scratch
  sz = group_sum<32>(sz);
  if (lane != 0) return;
  const int64_t t = a.target[(a.n0 + r) * a.target_stride];
  float zt = a.first ? NAN : a.st.z_target[r];
  if (t != a.ignore_index && t >= a.v0 && t < a.v0 + a.cols) zt = z[t - a.v0];
  if (!a.first) {
    st = rows::merge(Stats{a.st.max[r], a.st.sum[r]}, st);
    sz += a.st.sum_z[r];
  }
  a.st.max[r] = st.m, a.st.sum[r] = st.s, a.st.sum_z[r] = sz;
  a.st.z_target[r] = zt;
}

struct FinishArgs {
  RowState st;
  int64_t rows, n0, vocab;
  const int64_t* target;
  int64_t target_stride, ignore_index;
  float smoothing;
  float* lse;      // the op's lse output
  int64_t lse_stride;
  float* loss;     // loss output (none) or per-token losses (reduced)
  int64_t loss_stride;
};

// One thread per row of the token block: lse (every token) and the token's loss.
__global__ void finish_rows_kernel(FinishArgs a) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= a.rows) return;
  const int64_t n = a.n0 + r, t = a.target[n * a.target_stride];
  const float lse = a.st.max[r] + logf(a.st.sum[r]);
  a.lse[n * a.lse_stride] = lse;
  float loss = 0.0f;
  if (t != a.ignore_index) {
    const float mean_z = a.st.sum_z[r] / float(a.vocab);
    loss = (1.0f - a.smoothing) * (lse - a.st.z_target[r]) + a.smoothing * (lse - mean_z);
  }
  a.loss[n * a.loss_stride] = loss;
}

template <class T> struct GradArgs {
  float* z;  // the block's logits [rows, ld]; G in place when g16 is null (f32)
  T* g16;    // G in the input dtype, [rows, ld]
  float* partial;  // [groups, ld]: column sums of G per kGroupRows rows
  int64_t ld, rows, cols, v0, n0, vocab;
  const int64_t* target;
  int64_t target_stride, ignore_index;
  const void* lse;
  DType lse_dtype;
  int64_t lse_stride;
  const void* up;  // upstream gradient: dloss[n] (none, stride up_stride) or one scalar (stride 0)
  DType up_dtype;
  int64_t up_stride;
  float keep, smooth;  // 1 - label_smoothing, label_smoothing / V
};

// G = g (exp(z - lse) - keep [v == t] - smooth); 0 for ignored tokens, NaN for targets out of
// range. Block (32, 8): x over eight adjacent columns each (two 16-byte loads of f32 logits, one
// 16-byte store of 16-bit G: ld is a multiple of 8 and the workspace 256-byte aligned), y over
// the rows of one group of kGroupRows; the group's column sums are added in row order per y
// lane, then over the 8 lanes in order.
constexpr int kGradCols = 8, kGradLanes = 8;

// A (32, kGradLanes) block's column sums: each thread's kGradCols sums over its rows, then lane
// y = 0 adds the kGradLanes lanes in order and writes out[0 .. n_cols).
__device__ __forceinline__ void store_group_partials(const float (&acc)[kGradCols], int n_cols, float* out) {
  __shared__ float sums[kGradLanes][32 * kGradCols];
#pragma unroll
  for (int k = 0; k < kGradCols; ++k) sums[threadIdx.y][threadIdx.x * kGradCols + k] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0) return;
  for (int k = 0; k < n_cols; ++k) {
    const int j = threadIdx.x * kGradCols + k;
    float s = 0.0f;
#pragma unroll
    for (int lane = 0; lane < kGradLanes; ++lane) s += sums[lane][j];
    out[k] = s;
  }
}

template <class T> __global__ void __launch_bounds__(256) grad_kernel(GradArgs<T> a) {
  const int64_t c = int64_t(blockIdx.x) * (32 * kGradCols) + threadIdx.x * kGradCols;
  const int64_t r0 = int64_t(blockIdx.y) * kGroupRows;
  float acc[kGradCols] = {};
  const int n_cols = int(std::max<int64_t>(0, std::min<int64_t>(kGradCols, a.cols - c)));
  for (int rr = threadIdx.y; rr < kGroupRows; rr += kGradLanes) {
    const int64_t r = r0 + rr;
    if (r >= a.rows || n_cols == 0) break;
    const int64_t n = a.n0 + r, t = a.target[n * a.target_stride];
    const bool ignored = t == a.ignore_index, bad = !ignored && (t < 0 || t >= a.vocab);
    const float lse = loss::load_float(a.lse, a.lse_dtype, n * a.lse_stride);
    const float g = ignored ? 0.0f : loss::load_float(a.up, a.up_dtype, n * a.up_stride);
    float* zr = a.z + r * a.ld + c;
    float v[kGradCols];
    if (n_cols == kGradCols) {
      const float4 q0 = reinterpret_cast<const float4*>(zr)[0], q1 = reinterpret_cast<const float4*>(zr)[1];
      v[0] = q0.x, v[1] = q0.y, v[2] = q0.z, v[3] = q0.w, v[4] = q1.x, v[5] = q1.y, v[6] = q1.z, v[7] = q1.w;
    } else {
#pragma unroll
      for (int k = 0; k < kGradCols; ++k) v[k] = k < n_cols ? zr[k] : 0.0f;
    }
    const int64_t target_col = t - a.v0 - c;  // in [0, 8) when the target is one of these columns
#pragma unroll
    for (int k = 0; k < kGradCols; ++k) {
      float d = g * (expf(v[k] - lse) - (target_col == k ? a.keep : 0.0f) - a.smooth);
      if (ignored || k >= n_cols) d = 0.0f;
      if (bad) d = NAN;
      v[k] = d;
      acc[k] += d;
    }
    if (a.g16 != nullptr) {
      T* gr = a.g16 + r * a.ld + c;
      if constexpr (sizeof(T) * kGradCols == sizeof(uint4)) {
        if (n_cols == kGradCols) {
          union { uint4 u; T h[kGradCols]; } pack;
#pragma unroll
          for (int k = 0; k < kGradCols; ++k) pack.h[k] = from_f32<T>(v[k]);
          *reinterpret_cast<uint4*>(gr) = pack.u;
          continue;
        }
      }
      for (int k = 0; k < n_cols; ++k) gr[k] = from_f32<T>(v[k]);
    } else if (n_cols == kGradCols) {
      reinterpret_cast<float4*>(zr)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(zr)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      for (int k = 0; k < n_cols; ++k) zr[k] = v[k];
    }
  }
  store_group_partials(acc, n_cols, a.partial + int64_t(blockIdx.y) * a.ld + c);
}

// partial[group, c] = the sum of G[r, c] over the group's kGroupRows rows, G in the input dtype
// (row stride ld): db's share of a token block whose gradient ce_grad_rows wrote. The same
// block shape and order as grad_kernel's partials; one 16-byte load of eight 16-bit columns.
template <class T>
__global__ void __launch_bounds__(256) column_partials_kernel(const T* g, int64_t ld, int64_t rows, int64_t cols,
                                                              float* partial, int64_t partial_ld) {
  const int64_t c = int64_t(blockIdx.x) * (32 * kGradCols) + threadIdx.x * kGradCols;
  const int64_t r0 = int64_t(blockIdx.y) * kGroupRows;
  float acc[kGradCols] = {};
  const int n_cols = int(std::max<int64_t>(0, std::min<int64_t>(kGradCols, cols - c)));
  for (int rr = threadIdx.y; rr < kGroupRows; rr += kGradLanes) {
    const int64_t r = r0 + rr;
    if (r >= rows || n_cols == 0) break;
    const T* gr = g + r * ld + c;
    if constexpr (sizeof(T) * kGradCols == sizeof(uint4)) {
      if (n_cols == kGradCols) {
        union { uint4 u; T h[kGradCols]; } pack;
        pack.u = *reinterpret_cast<const uint4*>(gr);
#pragma unroll
        for (int k = 0; k < kGradCols; ++k) acc[k] += to_f32(pack.h[k]);
        continue;
      }
    }
    for (int k = 0; k < n_cols; ++k) acc[k] += to_f32(gr[k]);
  }
  store_group_partials(acc, n_cols, partial + int64_t(blockIdx.y) * partial_ld + c);
}

// db_acc[v0 + c] += the column's group partials. Block (32, 8): x over 32 columns, y over every
// eighth group (in order), then the 8 lane sums in order: a fixed order, 8 dependent loads a
// thread instead of one per group.
__global__ void __launch_bounds__(256) column_sums_kernel(const float* partial, int64_t groups, int64_t ld,
                                                          int64_t cols, float* db_acc) {
  __shared__ float lane_sums[8][32];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols)
    for (int64_t g = threadIdx.y; g < groups; g += 8) s += partial[g * ld + c];
  lane_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float total = 0.0f;
#pragma unroll
  for (int lane = 0; lane < 8; ++lane) total += lane_sums[lane][threadIdx.x];
  db_acc[c] += total;
}

// out[r * ld_out + k] = acc[r * cols + k] rounded to T.
template <class T>
__global__ void store_rows_kernel(const float* acc, int64_t rows, int64_t cols, T* out, int64_t ld_out) {
  const int64_t count = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    out[(i / cols) * ld_out + i % cols] = from_f32<T>(acc[i]);
}

// out = dloss[0] / count, or 0 when no token counts (Note [flce semantics]).
__global__ void mean_grad_kernel(const void* dloss, DType dtype, const float* count, float* out) {
  const float c = *count;
  *out = c > 0.0f ? float(double(loss::load_float(dloss, dtype, 0)) / double(c)) : 0.0f;
}

unsigned elementwise_grid(int64_t count) { return grid_for(std::min<int64_t>(count, int64_t(1) << 22), 256); }

// ---- views of the call ---------------------------------------------------------------------------------

int64_t ld_of(const TensorView& t, int64_t cols) { return t.rows() > 1 ? t.row_stride() : std::max<int64_t>(cols, 1); }
const char* row_ptr(const TensorView& t, int64_t ld, int64_t row) {
  return static_cast<const char*>(t.data) + row * ld * t.itemsize();
}

struct Call {
  const Context& ctx;
  const TensorView &hidden, &w, &target, &b;
  Plan plan;
  char* ws;
  int64_t h_ld, w_ld;
};

// logits [rows, cols] (f32, row stride plan.ld) = hidden[n0 .. n0 + rows) . w[v0 .. v0 + cols)^T + b.
void block_logits(const Call& c, int64_t n0, int64_t rows, int64_t v0, int64_t cols, float* logits) {
  cudaStream_t stream = stream_of(c.ctx);
  const bool bias = c.b.defined();
  if (bias) {
    dispatch_float(c.b.dtype, "fused_linear_cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      bias_fill_kernel<T><<<elementwise_grid(rows * cols), 256, 0, stream>>>(logits, rows, cols, c.plan.ld,
                                                                            c.b.ptr<T>(), v0);
      check_launch("fused_linear_cross_entropy bias launch");
    });
  }
  lt::Gemm g;
  g.m = rows, g.n = cols, g.k = c.plan.h;
  g.a = lt::Operand{row_ptr(c.hidden, c.h_ld, n0), c.hidden.dtype, c.h_ld, false};
  g.b = lt::Operand{row_ptr(c.w, c.w_ld, v0), c.w.dtype, c.w_ld, true};
  g.d = logits, g.d_dtype = DType::f32, g.ldd = c.plan.ld;
  g.beta = bias ? 1.0f : 0.0f;
  gemm(c.ctx, g, c.ws);
}

// The f32 regions of a plan in the call's workspace.
struct Regions {
  float *logits, *partial, *db_acc, *row_loss, *scalars;
};
Regions regions(const Plan& p, char* ws) {
  auto f32 = [&](int64_t offset) { return reinterpret_cast<float*>(ws + offset); };
  return Regions{f32(p.logits), f32(p.partial), f32(p.db_acc), f32(p.row_loss), f32(p.scalars)};
}

RowState row_state(const Plan& p, char* ws) {
  float* base = reinterpret_cast<float*>(ws + p.stats);
  return RowState{base, base + p.rows, base + 2 * p.rows, base + 3 * p.rows};
}

// The upstream gradient of each token: dloss[n] (none), dloss (sum), dloss / counted tokens (mean:
// counted on the device into scalars[0], the quotient in scalars[1]).
struct Upstream {
  const void* data;
  DType dtype;
  int64_t stride;  // 0: one value for every token
};
Upstream upstream_of(const Context& ctx, const TensorView& dloss, const TensorView& target, int64_t ignore_index,
                     std::string_view reduction, float* scalars) {
  Upstream u{dloss.data, dloss.dtype, reduction == "none" ? cuda::loss::stride0(dloss) : 0};
  const int64_t tokens = target.size(0);
  if (reduction == "mean" && tokens > 0) {
    cuda::loss::RowReduce r;
    r.rows = tokens, r.labels = target.ptr<int64_t>(), r.labels_stride = cuda::loss::stride0(target);
    r.ignore_index = ignore_index, r.count_only = true, r.out = scalars;
    cuda::loss::launch_row_reduce(ctx, r, "fused_linear_cross_entropy count launch");
    mean_grad_kernel<<<1, 1, 0, stream_of(ctx)>>>(dloss.data, dloss.dtype, scalars, scalars + 1);
    check_launch("fused_linear_cross_entropy scale launch");
    u = Upstream{scalars + 1, DType::f32, 0};
  }
  return u;
}

// loss = the sum (sum) or mean over counted tokens (mean; 0 when none counts) of the per-token
// losses (Note [loss row reduction]).
void reduce_losses(const Context& ctx, const float* row_loss, const TensorView& target, int64_t ignore_index,
                   std::string_view reduction, const TensorView& loss) {
  cuda::loss::RowReduce r;
  r.losses = row_loss, r.rows = target.size(0), r.labels = target.ptr<int64_t>();
  r.labels_stride = cuda::loss::stride0(target);
  r.ignore_index = ignore_index, r.divide = reduction == "mean", r.zero_if_none_kept = true;
  r.out = loss.ptr<float>();
  cuda::loss::launch_row_reduce(ctx, r, "fused_linear_cross_entropy reduction launch");
}

}  // namespace
}  // namespace cuda::flce

using namespace cuda::flce;  // NOLINT

int64_t flce_cuda_last_workspace_bytes() { return last_workspace_bytes; }

FlceCudaPlan flce_cuda_plan(int64_t tokens, int64_t hidden, int64_t vocab, DType dtype, bool backward,
                            bool reduced_forward) {
  const Plan p = plan_for(tokens, hidden, vocab, dtype, backward, reduced_forward);
  return FlceCudaPlan{p.rows, p.cols, p.total};
}

void fused_linear_cross_entropy_cuda(const Context& ctx, const TensorView& loss, const TensorView& lse,
                                     const TensorView& hidden, const TensorView& w, const TensorView& target,
                                     const TensorView& b, int64_t ignore_index, double label_smoothing,
                                     std::string_view reduction) {
  const int64_t tokens = hidden.size(0), h = hidden.size(1), vocab = w.size(0);
  const bool none = reduction == "none";
  cuda::DeviceGuard guard(ctx.device.index);
  cudaStream_t stream = cuda::stream_of(ctx);
  const Plan plan = plan_for(tokens, h, vocab, hidden.dtype, false, !none);
  last_workspace_bytes = plan.total;
  if (tokens == 0 && none) return;
  char* ws = static_cast<char*>(cuda_workspace(ctx, plan.total));
  const Call c{ctx, hidden, w, target, b, plan, ws, ld_of(hidden, h), ld_of(w, h)};
  float* logits = reinterpret_cast<float*>(ws + plan.logits);
  float* row_loss = reinterpret_cast<float*>(ws + plan.row_loss);
  const RowState st = row_state(plan, ws);
  const int64_t target_stride = cuda::loss::stride0(target);
  for (int64_t n0 = 0; n0 < tokens; n0 += plan.rows) {
    const int64_t rows = std::min(plan.rows, tokens - n0);
    for (int64_t v0 = 0; v0 < vocab; v0 += plan.cols) {
      const int64_t cols = std::min(plan.cols, vocab - v0);
      block_logits(c, n0, rows, v0, cols, logits);
      const MergeArgs m{logits, plan.ld, rows, cols, v0, n0, target.ptr<int64_t>(), target_stride, ignore_index, st,
                        v0 == 0};
      merge_block_kernel<<<cuda::grid_for(rows, 8), 256, 0, stream>>>(m);
      cuda::check_launch("fused_linear_cross_entropy row statistics launch");
    }
    FinishArgs f{st, rows, n0, vocab, target.ptr<int64_t>(), target_stride, ignore_index, float(label_smoothing),
                 lse.ptr<float>(), cuda::loss::stride0(lse), none ? loss.ptr<float>() : row_loss,
                 none ? cuda::loss::stride0(loss) : 1};
    finish_rows_kernel<<<cuda::grid_for(rows, 256), 256, 0, stream>>>(f);
    cuda::check_launch("fused_linear_cross_entropy row finish launch");
  }
  if (!none) reduce_losses(ctx, row_loss, target, ignore_index, reduction, loss);
}

void fused_linear_cross_entropy_backward_cuda(const Context& ctx, const TensorView& dhidden, const TensorView& dw,
                                              const TensorView& db, const TensorView& dloss,
                                              const TensorView& hidden, const TensorView& w,
                                              const TensorView& target, const TensorView& lse, const TensorView& b,
                                              int64_t ignore_index, double label_smoothing,
                                              std::string_view reduction) {
  const int64_t tokens = hidden.size(0), h = hidden.size(1), vocab = w.size(0);
  const DType dtype = hidden.dtype;
  cuda::DeviceGuard guard(ctx.device.index);
  cudaStream_t stream = cuda::stream_of(ctx);
  const Plan plan = plan_for(tokens, h, vocab, dtype, true, false);
  last_workspace_bytes = plan.total;
  char* ws = static_cast<char*>(cuda_workspace(ctx, plan.total));
  const Call c{ctx, hidden, w, target, b, plan, ws, ld_of(hidden, h), ld_of(w, h)};
  const int64_t dh_ld = ld_of(dhidden, h), dw_ld = ld_of(dw, h), item = dtype_size(dtype);
  const Regions at = regions(plan, ws);
  float *logits = at.logits, *partial = at.partial, *db_acc = at.db_acc, *scalars = at.scalars;
  OPFORGE_CUDA_CHECK(cudaMemsetAsync(db_acc, 0, size_t(vocab) * 4, stream));
  if (tokens == 0 && h > 0)  // dw = 0 (no block writes it)
    OPFORGE_CUDA_CHECK(cudaMemset2DAsync(dw.data, size_t(dw_ld * item), 0, size_t(h * item), size_t(vocab), stream));

  const Upstream u = upstream_of(ctx, dloss, target, ignore_index, reduction, scalars);
  const void* up = u.data;
  const DType up_dtype = u.dtype;
  const int64_t up_stride = u.stride;

  cuda::dispatch_float(dtype, "fused_linear_cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    T* g16 = plan.g16 ? reinterpret_cast<T*>(ws + plan.g) : nullptr;
    float* dh_acc = plan.g16 ? reinterpret_cast<float*>(ws + plan.dh_acc) : nullptr;
    const void* g_data = plan.g16 ? static_cast<const void*>(g16) : static_cast<const void*>(logits);
    for (int64_t n0 = 0; n0 < tokens; n0 += plan.rows) {
      const int64_t rows = std::min(plan.rows, tokens - n0), groups = ceil_div(rows, kGroupRows);
      for (int64_t v0 = 0; v0 < vocab; v0 += plan.cols) {
        const int64_t cols = std::min(plan.cols, vocab - v0);
        block_logits(c, n0, rows, v0, cols, logits);
        GradArgs<T> a{logits, g16, partial, plan.ld, rows, cols, v0, n0, vocab, target.ptr<int64_t>(),
                      cuda::loss::stride0(target), ignore_index, lse.data, lse.dtype, cuda::loss::stride0(lse),
                      up, up_dtype, up_stride, float(1.0 - label_smoothing), float(label_smoothing / double(vocab))};
        grad_kernel<T><<<dim3(cuda::grid_for(cols, 32 * kGradCols), unsigned(groups)), dim3(32, kGradLanes), 0,
                         stream>>>(a);
        cuda::check_launch("fused_linear_cross_entropy_backward gradient launch");
        column_sums_kernel<<<cuda::grid_for(cols, 32), dim3(32, 8), 0, stream>>>(partial, groups, plan.ld, cols,
                                                                              db_acc + v0);
        cuda::check_launch("fused_linear_cross_entropy_backward columns launch");
        // dw[v0 .. v0 + cols) (+)= G^T . hidden[n0 .. n0 + rows)
        cuda::lt::Gemm gw;
        gw.m = cols, gw.n = h, gw.k = rows;
        gw.a = cuda::lt::Operand{g_data, dtype, plan.ld, true};
        gw.b = cuda::lt::Operand{row_ptr(hidden, c.h_ld, n0), dtype, c.h_ld, false};
        gw.d = static_cast<char*>(dw.data) + v0 * dw_ld * item, gw.d_dtype = dtype, gw.ldd = dw_ld;
        gw.beta = n0 == 0 ? 0.0f : 1.0f;
        gemm(ctx, gw, ws);
        // dhidden[n0 .. n0 + rows) (+)= G . w[v0 .. v0 + cols), in f32
        cuda::lt::Gemm gd;
        gd.m = rows, gd.n = h, gd.k = cols;
        gd.a = cuda::lt::Operand{g_data, dtype, plan.ld, false};
        gd.b = cuda::lt::Operand{row_ptr(w, c.w_ld, v0), dtype, c.w_ld, false};
        if (dh_acc != nullptr) gd.d = dh_acc, gd.ldd = h;
        else gd.d = static_cast<char*>(dhidden.data) + n0 * dh_ld * item, gd.ldd = dh_ld;
        gd.d_dtype = DType::f32;
        gd.beta = v0 == 0 ? 0.0f : 1.0f;
        gemm(ctx, gd, ws);
      }
      if (dh_acc != nullptr && rows * h > 0) {
        store_rows_kernel<T><<<elementwise_grid(rows * h), 256, 0, stream>>>(
            dh_acc, rows, h, reinterpret_cast<T*>(static_cast<char*>(dhidden.data) + n0 * dh_ld * item), dh_ld);
        cuda::check_launch("fused_linear_cross_entropy_backward dhidden launch");
      }
    }
    store_rows_kernel<T><<<elementwise_grid(vocab), 256, 0, stream>>>(db_acc, 1, vocab, db.ptr<T>(), vocab);
    cuda::check_launch("fused_linear_cross_entropy_backward db launch");
  });
}

FlceCudaPlan flce_cuda_with_grad_plan(int64_t tokens, int64_t hidden, int64_t vocab, DType dtype, bool reduced) {
  const Plan p = with_grad_plan_for(tokens, hidden, vocab, dtype, reduced);
  return FlceCudaPlan{p.rows, p.rows > 0 ? p.cols : 0, p.total};
}

// Note [flce with grad]: per token block, the logits GEMM into f32 (all V columns), ce_grad_rows
// (loss, lse and the gradient G in the input dtype over the logits, row by row), G's column
// partials into db, then dw (+)= G^T . hidden_block (k = rows; beta 0 for the first block) and
// dhidden_block = G . w (k = V, straight into dhidden: one GEMM, no accumulator). Three GEMMs of
// 2 N V H each in all, the unfused form's count; a 16-bit dw is rounded once per token block.
void fused_linear_cross_entropy_with_grad_cuda(const Context& ctx, const TensorView& loss, const TensorView& lse,
                                               const TensorView& dhidden, const TensorView& dw, const TensorView& db,
                                               const TensorView& hidden, const TensorView& w,
                                               const TensorView& target, const TensorView& dloss,
                                               const TensorView& b, int64_t ignore_index, double label_smoothing,
                                               std::string_view reduction) {
  const int64_t tokens = hidden.size(0), h = hidden.size(1), vocab = w.size(0);
  const DType dtype = hidden.dtype;
  const bool none = reduction == "none";
  cuda::DeviceGuard guard(ctx.device.index);
  const Plan plan = with_grad_plan_for(tokens, h, vocab, dtype, !none);
  if (tokens == 0 || plan.rows == 0 || !ce_grad_rows_fit(ctx, vocab, dtype)) {
    // The two ops in turn (the backward reads the lse just written): logits twice.
    fused_linear_cross_entropy_cuda(ctx, loss, lse, hidden, w, target, b, ignore_index, label_smoothing, reduction);
    const int64_t forward_bytes = last_workspace_bytes;
    fused_linear_cross_entropy_backward_cuda(ctx, dhidden, dw, db, dloss, hidden, w, target, lse, b, ignore_index,
                                             label_smoothing, reduction);
    last_workspace_bytes = std::max(last_workspace_bytes, forward_bytes);
    return;
  }
  last_workspace_bytes = plan.total;
  cudaStream_t stream = cuda::stream_of(ctx);
  char* ws = static_cast<char*>(cuda_workspace(ctx, plan.total));
  const Call c{ctx, hidden, w, target, b, plan, ws, ld_of(hidden, h), ld_of(w, h)};
  const int64_t dh_ld = ld_of(dhidden, h), dw_ld = ld_of(dw, h), item = dtype_size(dtype);
  const Regions at = regions(plan, ws);
  float *logits = at.logits, *partial = at.partial, *db_acc = at.db_acc, *row_loss = at.row_loss;
  OPFORGE_CUDA_CHECK(cudaMemsetAsync(db_acc, 0, size_t(vocab) * 4, stream));
  const Upstream u = upstream_of(ctx, dloss, target, ignore_index, reduction, at.scalars);
  const int64_t target_stride = cuda::loss::stride0(target), lse_stride = cuda::loss::stride0(lse);
  const int64_t loss_stride = none ? cuda::loss::stride0(loss) : 1;
  float* losses = none ? loss.ptr<float>() : row_loss;
  // G row r starts where logits row r does: plan.ld f32 elements = (4 / item) plan.ld of G's.
  const int64_t g_ld = plan.ld * 4 / item;
  cuda::dispatch_float(dtype, "fused_linear_cross_entropy_with_grad", [&](auto tag) {
    using T = decltype(tag);
    T* g = reinterpret_cast<T*>(logits);
    for (int64_t n0 = 0; n0 < tokens; n0 += plan.rows) {
      const int64_t rows = std::min(plan.rows, tokens - n0), groups = ceil_div(rows, kGroupRows);
      block_logits(c, n0, rows, 0, vocab, logits);
      CeGradRows a{logits, plan.ld, g, dtype, g_ld, rows, vocab,
                   target.ptr<int64_t>() + n0 * target_stride, target_stride,
                   static_cast<const char*>(u.data) + n0 * u.stride * dtype_size(u.dtype), u.dtype, u.stride,
                   losses + n0 * loss_stride, loss_stride, lse.ptr<float>() + n0 * lse_stride, lse_stride,
                   ignore_index, float(label_smoothing)};
      ce_grad_rows(ctx, a);
      column_partials_kernel<T><<<dim3(cuda::grid_for(vocab, 32 * kGradCols), unsigned(groups)), dim3(32, kGradLanes),
                                  0, stream>>>(g, g_ld, rows, vocab, partial, plan.ld);
      cuda::check_launch("fused_linear_cross_entropy_with_grad column partials launch");
      column_sums_kernel<<<cuda::grid_for(vocab, 32), dim3(32, 8), 0, stream>>>(partial, groups, plan.ld, vocab,
                                                                             db_acc);
      cuda::check_launch("fused_linear_cross_entropy_with_grad columns launch");
      // dw (+)= G^T . hidden[n0 .. n0 + rows)
      cuda::lt::Gemm gw;
      gw.m = vocab, gw.n = h, gw.k = rows;
      gw.a = cuda::lt::Operand{g, dtype, g_ld, true};
      gw.b = cuda::lt::Operand{row_ptr(hidden, c.h_ld, n0), dtype, c.h_ld, false};
      gw.d = dw.data, gw.d_dtype = dtype, gw.ldd = dw_ld;
      gw.beta = n0 == 0 ? 0.0f : 1.0f;
      gemm(ctx, gw, ws);
      // dhidden[n0 .. n0 + rows) = G . w
      cuda::lt::Gemm gd;
      gd.m = rows, gd.n = h, gd.k = vocab;
      gd.a = cuda::lt::Operand{g, dtype, g_ld, false};
      gd.b = cuda::lt::Operand{row_ptr(w, c.w_ld, 0), dtype, c.w_ld, false};
      gd.d = static_cast<char*>(dhidden.data) + n0 * dh_ld * item, gd.d_dtype = dtype, gd.ldd = dh_ld;
      gd.beta = 0.0f;
      gemm(ctx, gd, ws);
    }
    store_rows_kernel<T><<<elementwise_grid(vocab), 256, 0, stream>>>(db_acc, 1, vocab, db.ptr<T>(), vocab);
    cuda::check_launch("fused_linear_cross_entropy_with_grad db launch");
  });
  if (!none) reduce_losses(ctx, row_loss, target, ignore_index, reduction, loss);
}

const char* fused_linear_cross_entropy_with_grad_cuda_applicable(
    const TensorView& loss, const TensorView& lse, const TensorView&, const TensorView&, const TensorView&,
    const TensorView& hidden, const TensorView&, const TensorView&, const TensorView& dloss, const TensorView&,
    int64_t, double, std::string_view) {
  if (!cuda::is_cuda_float(hidden.dtype)) return cuda::kNotCudaFloat;
  if (loss.dtype != DType::f32 || lse.dtype != DType::f32) return "loss or lse is not f32";
  if (!cuda::loss::float_like(dloss.dtype)) return "dloss is not f64, f32, f16 or bf16";
  return nullptr;
}

const char* fused_linear_cross_entropy_cuda_applicable(const TensorView& loss, const TensorView& lse,
                                                       const TensorView& hidden, const TensorView&,
                                                       const TensorView&, const TensorView&, int64_t, double,
                                                       std::string_view) {
  if (!cuda::is_cuda_float(hidden.dtype)) return cuda::kNotCudaFloat;
  if (loss.dtype != DType::f32 || lse.dtype != DType::f32) return "loss or lse is not f32";
  return nullptr;
}
const char* fused_linear_cross_entropy_backward_cuda_applicable(const TensorView&, const TensorView&,
                                                                const TensorView&, const TensorView& dloss,
                                                                const TensorView& hidden, const TensorView&,
                                                                const TensorView&, const TensorView& lse,
                                                                const TensorView&, int64_t, double,
                                                                std::string_view) {
  if (!cuda::is_cuda_float(hidden.dtype)) return cuda::kNotCudaFloat;
  if (!cuda::loss::float_like(dloss.dtype)) return "dloss is not f64, f32, f16 or bf16";
  if (!cuda::loss::float_like(lse.dtype)) return "lse is not f64, f32, f16 or bf16";
  return nullptr;
}

void register_flce_cuda(Registry& reg) {
  // f32 sums of H (logits) and V or tokens (gradients) products in another order than the
  // reference's: the GEMM bound of the linear kernels.
  auto desc = [](const char* summary) {
    KernelDesc d = cuda_kernel_desc("cuda", 100, summary, false);
    d.tolerances[DType::f32] = {1e-4, 1e-4, 1e-9};
    d.properties.batch_invariant = false;  // the GEMM algorithm depends on the block's rows
    return d;
  };
  reg.add_kernel<FusedLinearCrossEntropy>(
      desc("token x vocabulary blocks in the workspace: cuBLASLt f32 logits, online log-sum-exp per row"),
      &fused_linear_cross_entropy_cuda, &fused_linear_cross_entropy_cuda_applicable);
  KernelDesc bwd = desc("vocabulary blocks per token block: logits recomputed, gradient from the saved lse, "
                        "cuBLASLt into dw slices and an f32 dhidden accumulator");
  // G enters the GEMMs rounded to the input dtype, and a 16-bit dw is rounded once per token
  // block (three times at 8,192 tokens x 128,256; an f32 [V, H] accumulator would break the
  // 1/8-of-logits memory bound): elementwise bounds 2.5x (bf16) and 4x (f16) the defaults, the
  // aggregate bound (nmse) the default one.
  bwd.tolerances[DType::bf16] = {4e-2, 4e-2, 5e-5};
  bwd.tolerances[DType::f16] = {8e-3, 8e-3, 1e-6};
  reg.add_kernel<FusedLinearCrossEntropyBackward>(
      bwd,
      &fused_linear_cross_entropy_backward_cuda, &fused_linear_cross_entropy_backward_cuda_applicable);
  // The backward's bounds: G in the input dtype, dw rounded once per token block (22 blocks at
  // 8,192 x 128,256 in bf16, Note [flce with grad]).
  KernelDesc both = desc("token blocks of whole rows: cuBLASLt f32 logits once, the cluster cross-entropy "
                         "kernel writes loss, lse and the gradient over them, cuBLASLt into dw and dhidden");
  both.tolerances = bwd.tolerances;
  reg.add_kernel<FusedLinearCrossEntropyWithGrad>(both, &fused_linear_cross_entropy_with_grad_cuda,
                                                  &fused_linear_cross_entropy_with_grad_cuda_applicable);
}

}  // namespace opforge
