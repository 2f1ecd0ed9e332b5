// CUDA kernels of fused_linear_cross_entropy and its backward (Note [flce semantics], linear.h).
//
// Assumes: f32 / f16 / bf16 (f64 goes to the reference), Note [row layout] for hidden, w,
// dhidden, dw (padded rows are leading dimensions), target int64 on the device (values not
// range-checked: a target outside [0, V) other than ignore_index gives NaN, as cross_entropy's
// CUDA kernels), the op's check has run.
//
// Technique. The [tokens, V] logits never exist: tokens are taken in chunks (Note [flce cuda
// chunks]); for each chunk
//  1. logits [rows, V] in f32 = hidden_chunk . w^T (+ b: the chunk is first filled with b and the
//     product added with beta = 1) by one cuBLASLt GEMM (cuda::lt::matmul, ops/linear/cublaslt.cuh:
//     the linear op's handle and algorithm cache; A/B in the input dtype, D in f32, f32
//     accumulation), so the logits are never rounded to the input dtype;
//  2. the cross_entropy CUDA kernels (ops/loss/cuda.cu: cross_entropy_cuda(_vec16) with reduction
//     none) read each logit row once for lse and the row's loss (16-byte packs when V % 4 == 0);
//  3. backward only: cross_entropy_backward_cuda(_vec16) turns the chunk into its gradient G in
//     place (f32, from the lse just computed; reduction none with the dloss slice, or sum with
//     the scalar upstream gradient: dloss, or dloss / counted tokens computed on the device);
//     one column pass adds G's column sums (rows in order) into an f32 db accumulator and, for
//     f16 / bf16, writes G in the input dtype (cuBLASLt multiplies operands of one dtype); then
//     dhidden_chunk = G . w (beta 0, one rounding) and dw (+)= G^T . hidden_chunk (beta 0 for the
//     first chunk, 1 after: f32 accumulation inside each product; a 16-bit dw is rounded once per
//     chunk). db is rounded once at the end.
// The per-token losses of sum / mean are added by Note [loss row reduction] (one block, fixed
// order, on the device: no host synchronization; mean of zero counted tokens is 0). Everything
// lives in the stream's workspace (Note [cuda workspace]): no allocation after the first call of
// a shape. Shapes for which cuBLASLt has no algorithm (or K = 0) take a tiled GEMM (64 x 64 tiles,
// f32 sums, any strides) instead. Deterministic: fixed-order reductions, cached algorithms,
// chunks in order.
//
// Note [flce cuda chunks]: with s the input dtype's size, the call's workspace is
//   32 MiB (cuBLASLt) + chunk x (4 V + 8) (f32 logits, lse, loss) + chunk x s V (16-bit G,
//   backward) + 4 V (db accumulator, backward) + 4 tokens (per-token losses, reduced forward).
// chunk = the most rows for which that total stays within the largest power of two not above
// tokens x V x s / 8 (1/8 of the logits in the input dtype; a power of two because the backend
// grows its workspace to the next power of two), rounded down to a multiple of 64, and at least
// 64 (at most all tokens). So the extra memory of a call stays below 1/8 of the logits once 64
// rows fit under that eighth: at V = 128256 in bf16 from about 2,600 tokens on (backward; 2,100
// forward); below that the 64-row floor and cuBLASLt's 32 MiB dominate. At 8,192 tokens: chunks
// of 192 rows forward and 128 backward, about 132 MB of workspace against 263 MB (1/8 of 2.1 GB
// of bf16 logits). flce_cuda_last_workspace_bytes() tells a call's figure, flce_cuda_plan() the
// plan of a shape.
#include <algorithm>
#include <string_view>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/linear/cublaslt.cuh"
#include "ops/linear/linear_cuda.h"
#include "ops/loss/loss_cuda.cuh"
#include "ops/loss/loss_cuda.h"

namespace opforge {
namespace cuda::flce {
namespace {

thread_local int64_t last_workspace_bytes = 0;

// ---- tiled fallback GEMM: D[m, n] = beta D + sum_k A(i, k) B(k, j), any element strides ----------
constexpr int kTile = 64, kStepK = 16;

template <class T, class TD> struct TiledArgs {
  const T* a;
  int64_t a_row, a_col;  // A(i, k) = a[i * a_row + k * a_col]
  const T* b;
  int64_t b_row, b_col;  // B(k, j) = b[k * b_row + j * b_col]
  TD* d;
  int64_t ldd, m, n, k;
  float beta;
};

template <class T, class TD> __global__ void __launch_bounds__(256) tiled_kernel(TiledArgs<T, TD> p) {
  __shared__ float as[kStepK][kTile + 1];  // as[kk][row]
  __shared__ float bs[kStepK][kTile + 1];  // bs[kk][col]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t col0 = int64_t(blockIdx.x) * kTile;
  for (int64_t row0 = int64_t(blockIdx.y) * kTile; row0 < p.m; row0 += int64_t(gridDim.y) * kTile) {
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < p.k; k0 += kStepK) {
      for (int e = threadIdx.x; e < kTile * kStepK; e += 256) {
        const int r = e / kStepK, kk = e % kStepK;
        const int64_t kg = k0 + kk, ar = row0 + r, bc = col0 + r;
        as[kk][r] = (ar < p.m && kg < p.k) ? to_f32(p.a[ar * p.a_row + kg * p.a_col]) : 0.0f;
        bs[kk][r] = (bc < p.n && kg < p.k) ? to_f32(p.b[kg * p.b_row + bc * p.b_col]) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kStepK; ++kk) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i], bv[i] = bs[kk][tx + 16 * i];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = row0 + ty + 16 * i;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t col = col0 + tx + 16 * j;
        if (col >= p.n) continue;
        TD* out = p.d + row * p.ldd + col;
        const float prior = p.beta != 0.0f ? p.beta * to_f32(*out) : 0.0f;
        *out = from_f32<TD>(acc[i][j] + prior);
      }
    }
  }
}

template <class T, class TD> void run_tiled(const Context& ctx, const lt::Gemm& g) {
  TiledArgs<T, TD> p{};
  p.a = static_cast<const T*>(g.a.data);
  p.a_row = g.a.trans ? 1 : g.a.ld, p.a_col = g.a.trans ? g.a.ld : 1;
  p.b = static_cast<const T*>(g.b.data);
  p.b_row = g.b.trans ? 1 : g.b.ld, p.b_col = g.b.trans ? g.b.ld : 1;
  p.d = static_cast<TD*>(g.d), p.ldd = g.ldd, p.m = g.m, p.n = g.n, p.k = g.k, p.beta = g.beta;
  const dim3 grid(grid_for(g.n, kTile), unsigned(std::min<int64_t>((g.m + kTile - 1) / kTile, 65535)));
  tiled_kernel<T, TD><<<grid, 256, 0, stream_of(ctx)>>>(p);
  check_launch("fused_linear_cross_entropy tiled GEMM launch");
}

// D = op(A) op(B) + beta D through cuBLASLt, or the tiled kernel when it has no algorithm.
void gemm(const Context& ctx, const lt::Gemm& g, void* lt_workspace) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0 && g.beta == 1.0f) return;  // D unchanged
  if (g.k > 0 && lt::matmul(ctx, g, lt_workspace)) return;
  dispatch_float(g.a.dtype, "fused_linear_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    if (g.d_dtype == DType::f32) run_tiled<T, float>(ctx, g);
    else run_tiled<T, T>(ctx, g);
  });
}

// ---- small kernels ----------------------------------------------------------------------------------

// logits[r, v] = b[v] for the chunk's rows (f32).
template <class T> __global__ void bias_fill_kernel(float* logits, int64_t count, int64_t vocab, const T* b) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    logits[i] = to_f32(b[i % vocab]);
}

// One thread per column v: db_acc[v] += sum over the chunk's rows of G[r, v] (rows in order), and
// g16[r, v] = G[r, v] rounded to T when g16 is not null. Adjacent threads read adjacent columns
// (coalesced rows).
template <class T>
__global__ void __launch_bounds__(256) columns_kernel(const float* g, int64_t rows, int64_t vocab, float* db_acc, T* g16) {
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vocab) return;
  float s = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float x = g[r * vocab + v];
    s += x;
    if (g16 != nullptr) g16[r * vocab + v] = from_f32<T>(x);
  }
  db_acc[v] += s;
}

template <class T> __global__ void store_kernel(const float* acc, T* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(acc[i]);
}

// out = dloss[0] / count, or 0 when no token counts (Note [flce semantics]).
__global__ void mean_grad_kernel(const void* dloss, DType dtype, const float* count, float* out) {
  const float c = *count;
  *out = c > 0.0f ? float(double(loss::load_float(dloss, dtype, 0)) / double(c)) : 0.0f;
}

// ---- the plan of a call -----------------------------------------------------------------------------

constexpr int64_t kAlign = 256;
int64_t up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct Plan {
  int64_t tokens = 0, h = 0, vocab = 0, chunk = 0;
  int64_t logits = 0, g16 = 0, lse = 0, row_loss = 0, db_acc = 0, scalars = 0, total = 0;  // byte offsets
};

// Note [flce cuda chunks].
Plan plan_for(int64_t tokens, int64_t h, int64_t vocab, DType dtype, bool backward, bool reduced_forward) {
  const int64_t s = dtype_size(dtype);
  const bool g16 = backward && dtype != DType::f32;
  const int64_t per_row = 4 * vocab + 8 + (g16 ? s * vocab : 0);
  const int64_t fixed = lt::kWorkspaceBytes + (backward ? 4 * vocab : 0) + (reduced_forward ? 4 * tokens : 0) + 8 * kAlign;
  int64_t budget = 1;
  const double eighth = double(tokens) * double(vocab) * double(s) / 8.0;
  while (double(budget) * 2.0 <= eighth) budget *= 2;
  int64_t rows = budget > fixed ? (budget - fixed) / per_row : 0;
  rows = rows >= 64 ? rows / 64 * 64 : 64;
  Plan p;
  p.tokens = tokens, p.h = h, p.vocab = vocab;
  p.chunk = std::max<int64_t>(1, std::min(rows, tokens));
  int64_t at = up(lt::kWorkspaceBytes);
  auto take = [&](int64_t bytes) {
    const int64_t off = at;
    at += up(std::max<int64_t>(bytes, 0));
    return off;
  };
  p.logits = take(p.chunk * vocab * 4);
  p.g16 = take(g16 ? p.chunk * vocab * s : 0);
  p.lse = take(p.chunk * 4);
  p.row_loss = take((reduced_forward ? tokens : p.chunk) * 4);
  p.db_acc = take(backward ? vocab * 4 : 0);
  p.scalars = take(2 * 4);
  p.total = at;
  return p;
}

// ---- views of the chunk ------------------------------------------------------------------------------

int64_t ld_of(const TensorView& t, int64_t cols) { return t.rows() > 1 ? t.row_stride() : std::max<int64_t>(cols, 1); }

TensorView vector_view(void* data, DType dtype, int64_t n, int64_t stride, Device device) {
  const int64_t strides[1] = {stride};
  return TensorView(data, dtype, Shape{n}, strides, device);
}
// Elements [n0, n0 + n) of a 1-d tensor.
TensorView slice(const TensorView& t, int64_t n0, int64_t n) {
  const int64_t stride = t.stride(0);
  return vector_view(static_cast<char*>(t.data) + n0 * stride * t.itemsize(), t.dtype, n, stride, t.device);
}
const char* row_ptr(const TensorView& t, int64_t ld, int64_t row) {
  return static_cast<const char*>(t.data) + row * ld * t.itemsize();
}

struct Call {
  const Context& ctx;
  const TensorView &hidden, &w, &target, &b;
  int64_t ignore_index;
  double label_smoothing;
  Plan plan;
  char* ws;
  int64_t h_ld, w_ld;
};

// logits [rows, V] (f32, dense) = hidden[n0 .. n0 + rows) . w^T + b.
void chunk_logits(const Call& c, int64_t n0, int64_t rows, float* logits) {
  const int64_t vocab = c.plan.vocab, h = c.plan.h;
  cudaStream_t stream = stream_of(c.ctx);
  const bool bias = c.b.defined();
  if (bias) {
    dispatch_float(c.b.dtype, "fused_linear_cross_entropy", [&](auto tag) {
      using T = decltype(tag);
      const int64_t count = rows * vocab;
      bias_fill_kernel<T><<<grid_for(std::min<int64_t>(count, int64_t(1) << 22), 256), 256, 0, stream>>>(
          logits, count, vocab, c.b.ptr<T>());
      check_launch("fused_linear_cross_entropy bias launch");
    });
  }
  lt::Gemm g;
  g.m = rows, g.n = vocab, g.k = h;
  g.a = lt::Operand{row_ptr(c.hidden, c.h_ld, n0), c.hidden.dtype, c.h_ld, false};
  g.b = lt::Operand{c.w.data, c.w.dtype, c.w_ld, true};
  g.d = logits, g.d_dtype = DType::f32, g.ldd = vocab;
  g.beta = bias ? 1.0f : 0.0f;
  gemm(c.ctx, g, c.ws);
}

// cross_entropy with reduction none on a chunk of f32 logits: lse and per-row losses.
void chunk_cross_entropy(const Call& c, const TensorView& logits, const TensorView& target, const TensorView& loss,
                         const TensorView& lse) {
  const char* why = cross_entropy_cuda_vec16_applicable(loss, lse, logits, target, c.ignore_index, c.label_smoothing,
                                                        0.0, 0.0, "none");
  auto fn = why == nullptr ? &cross_entropy_cuda_vec16 : &cross_entropy_cuda;
  fn(c.ctx, loss, lse, logits, target, c.ignore_index, c.label_smoothing, 0.0, 0.0, "none");
}

}  // namespace
}  // namespace cuda::flce

using namespace cuda::flce;  // NOLINT

int64_t flce_cuda_last_workspace_bytes() { return last_workspace_bytes; }

FlceCudaPlan flce_cuda_plan(int64_t tokens, int64_t hidden, int64_t vocab, DType dtype, bool backward,
                            bool reduced_forward) {
  const Plan p = plan_for(tokens, hidden, vocab, dtype, backward, reduced_forward);
  return FlceCudaPlan{p.chunk, p.total};
}

void fused_linear_cross_entropy_cuda(const Context& ctx, const TensorView& loss, const TensorView& hidden,
                                     const TensorView& w, const TensorView& target, const TensorView& b,
                                     int64_t ignore_index, double label_smoothing, std::string_view reduction) {
  const int64_t tokens = hidden.size(0), h = hidden.size(1), vocab = w.size(0);
  const bool none = reduction == "none";
  cuda::DeviceGuard guard(ctx.device.index);
  const Plan plan = plan_for(tokens, h, vocab, hidden.dtype, false, !none);
  last_workspace_bytes = plan.total;
  if (none && tokens == 0) return;
  char* ws = static_cast<char*>(cuda_workspace(ctx, plan.total));
  const Call c{ctx, hidden, w, target, b, ignore_index, label_smoothing, plan, ws, ld_of(hidden, h), ld_of(w, h)};
  float* logits = reinterpret_cast<float*>(ws + plan.logits);
  float* row_loss = reinterpret_cast<float*>(ws + plan.row_loss);
  for (int64_t n0 = 0; n0 < tokens; n0 += plan.chunk) {
    const int64_t rows = std::min(plan.chunk, tokens - n0);
    chunk_logits(c, n0, rows, logits);
    const TensorView logits_v(logits, DType::f32, Shape{rows, vocab}, hidden.device);
    const TensorView lse_v(ws + plan.lse, DType::f32, Shape{rows}, hidden.device);
    const TensorView loss_v = none ? slice(loss, n0, rows) : TensorView(row_loss + n0, DType::f32, Shape{rows}, hidden.device);
    chunk_cross_entropy(c, logits_v, slice(target, n0, rows), loss_v, lse_v);
  }
  if (none) return;
  cuda::loss::RowReduce r;
  r.losses = row_loss, r.rows = tokens, r.labels = target.ptr<int64_t>(), r.labels_stride = cuda::loss::stride0(target);
  r.ignore_index = ignore_index, r.divide = reduction == "mean", r.zero_if_none_kept = true;
  r.out = loss.ptr<float>();
  cuda::loss::launch_row_reduce(cuda::stream_of(ctx), r, "fused_linear_cross_entropy reduction launch");
}

void fused_linear_cross_entropy_backward_cuda(const Context& ctx, const TensorView& dhidden, const TensorView& dw,
                                              const TensorView& db, const TensorView& dloss,
                                              const TensorView& hidden, const TensorView& w,
                                              const TensorView& target, const TensorView& b, int64_t ignore_index,
                                              double label_smoothing, std::string_view reduction) {
  const int64_t tokens = hidden.size(0), h = hidden.size(1), vocab = w.size(0);
  const DType dtype = hidden.dtype;
  cuda::DeviceGuard guard(ctx.device.index);
  cudaStream_t stream = cuda::stream_of(ctx);
  const Plan plan = plan_for(tokens, h, vocab, dtype, true, false);
  last_workspace_bytes = plan.total;
  char* ws = static_cast<char*>(cuda_workspace(ctx, plan.total));
  const Call c{ctx, hidden, w, target, b, ignore_index, label_smoothing, plan, ws, ld_of(hidden, h), ld_of(w, h)};
  const int64_t dh_ld = ld_of(dhidden, h), dw_ld = ld_of(dw, h), item = dtype_size(dtype);
  float* logits = reinterpret_cast<float*>(ws + plan.logits);
  float* db_acc = reinterpret_cast<float*>(ws + plan.db_acc);
  float* scalars = reinterpret_cast<float*>(ws + plan.scalars);
  OPFORGE_CUDA_CHECK(cudaMemsetAsync(db_acc, 0, size_t(vocab) * 4, stream));
  if (tokens == 0 && h > 0)  // dw = 0 (no chunk writes it)
    OPFORGE_CUDA_CHECK(cudaMemset2DAsync(dw.data, size_t(dw_ld * item), 0, size_t(h * item), size_t(vocab), stream));

  // The upstream gradient of each row: dloss[n] (none), dloss (sum), dloss / counted tokens (mean).
  const bool none = reduction == "none";
  TensorView scalar_g = dloss;
  if (reduction == "mean" && tokens > 0) {
    cuda::loss::RowReduce r;
    r.rows = tokens, r.labels = target.ptr<int64_t>(), r.labels_stride = cuda::loss::stride0(target);
    r.ignore_index = ignore_index, r.count_only = true, r.out = scalars;
    cuda::loss::launch_row_reduce(stream, r, "fused_linear_cross_entropy_backward count launch");
    mean_grad_kernel<<<1, 1, 0, stream>>>(dloss.data, dloss.dtype, scalars, scalars + 1);
    cuda::check_launch("fused_linear_cross_entropy_backward scale launch");
    scalar_g = TensorView(scalars + 1, DType::f32, Shape{1}, hidden.device);
  }

  for (int64_t n0 = 0; n0 < tokens; n0 += plan.chunk) {
    const int64_t rows = std::min(plan.chunk, tokens - n0);
    chunk_logits(c, n0, rows, logits);
    const TensorView logits_v(logits, DType::f32, Shape{rows, vocab}, hidden.device);
    const TensorView lse_v(ws + plan.lse, DType::f32, Shape{rows}, hidden.device);
    const TensorView loss_v(ws + plan.row_loss, DType::f32, Shape{rows}, hidden.device);
    const TensorView target_v = slice(target, n0, rows);
    chunk_cross_entropy(c, logits_v, target_v, loss_v, lse_v);
    // G = dloss/dlogits over the chunk, in place.
    const TensorView upstream = none ? slice(dloss, n0, rows) : scalar_g;
    const char* red = none ? "none" : "sum";
    const char* why = cross_entropy_backward_cuda_vec16_applicable(logits_v, upstream, logits_v, target_v, lse_v,
                                                                   ignore_index, label_smoothing, 0.0, 0.0, red);
    auto bwd = why == nullptr ? &cross_entropy_backward_cuda_vec16 : &cross_entropy_backward_cuda;
    bwd(ctx, logits_v, upstream, logits_v, target_v, lse_v, ignore_index, label_smoothing, 0.0, 0.0, red);
    // db += column sums of G; G in the input dtype for the products.
    const void* g_data = logits;
    cuda::dispatch_float(dtype, "fused_linear_cross_entropy_backward", [&](auto tag) {
      using T = decltype(tag);
      T* g16 = dtype == DType::f32 ? nullptr : reinterpret_cast<T*>(ws + plan.g16);
      columns_kernel<T><<<cuda::grid_for(vocab, 256), 256, 0, stream>>>(logits, rows, vocab, db_acc, g16);
      cuda::check_launch("fused_linear_cross_entropy_backward columns launch");
      if (g16 != nullptr) g_data = g16;
    });
    // dhidden[n0 .. n0 + rows) = G . w
    cuda::lt::Gemm gd;
    gd.m = rows, gd.n = h, gd.k = vocab;
    gd.a = cuda::lt::Operand{g_data, dtype, vocab, false};
    gd.b = cuda::lt::Operand{w.data, dtype, c.w_ld, false};
    gd.d = static_cast<char*>(dhidden.data) + n0 * dh_ld * item, gd.d_dtype = dtype, gd.ldd = dh_ld;
    gemm(ctx, gd, ws);
    // dw (+)= G^T . hidden[n0 .. n0 + rows)
    cuda::lt::Gemm gw;
    gw.m = vocab, gw.n = h, gw.k = rows;
    gw.a = cuda::lt::Operand{g_data, dtype, vocab, true};
    gw.b = cuda::lt::Operand{row_ptr(hidden, c.h_ld, n0), dtype, c.h_ld, false};
    gw.d = dw.data, gw.d_dtype = dtype, gw.ldd = dw_ld;
    gw.beta = n0 == 0 ? 0.0f : 1.0f;
    gemm(ctx, gw, ws);
  }
  cuda::dispatch_float(dtype, "fused_linear_cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    store_kernel<T><<<cuda::grid_for(vocab, 256), 256, 0, stream>>>(db_acc, db.ptr<T>(), vocab);
    cuda::check_launch("fused_linear_cross_entropy_backward db launch");
  });
}

const char* fused_linear_cross_entropy_cuda_applicable(const TensorView& loss, const TensorView& hidden,
                                                       const TensorView&, const TensorView&, const TensorView&,
                                                       int64_t, double, std::string_view) {
  if (!cuda::is_cuda_float(hidden.dtype)) return cuda::kNotCudaFloat;
  if (loss.dtype != DType::f32) return "loss is not f32";
  return nullptr;
}
const char* fused_linear_cross_entropy_backward_cuda_applicable(const TensorView&, const TensorView&,
                                                                const TensorView&, const TensorView& dloss,
                                                                const TensorView& hidden, const TensorView&,
                                                                const TensorView&, const TensorView&, int64_t,
                                                                double, std::string_view) {
  if (!cuda::is_cuda_float(hidden.dtype)) return cuda::kNotCudaFloat;
  if (!cuda::loss::float_like(dloss.dtype)) return "dloss is not f64, f32, f16 or bf16";
  return nullptr;
}

void register_flce_cuda(Registry& reg) {
  // f32 sums of H (logits) and V or tokens (gradients) products in another order than the
  // reference's: the GEMM bound of the linear kernels.
  auto desc = [](const char* summary) {
    KernelDesc d = cuda_kernel_desc("cuda", 100, summary, false);
    d.tolerances[DType::f32] = {1e-4, 1e-4, 1e-9};
    d.properties.batch_invariant = false;  // the GEMM algorithm depends on the chunk's rows
    return d;
  };
  reg.add_kernel<FusedLinearCrossEntropy>(
      desc("token chunks in the workspace: cuBLASLt f32 logits + cross_entropy kernels, fixed-order sum"),
      &fused_linear_cross_entropy_cuda, &fused_linear_cross_entropy_cuda_applicable);
  KernelDesc bwd = desc("token chunks: logits recomputed, gradient in place, cuBLASLt into dhidden and dw");
  // 16-bit dw is accumulated in its own dtype across token chunks (an f32 [V, H] accumulator
  // would break the 1/8-of-logits memory bound; Liger-Kernel accumulates grad_weight the same
  // way) and G enters the GEMMs rounded to the input dtype: elementwise bounds 2.5x (bf16) and
  // 4x (f16) the defaults, the aggregate bound (nmse) the default one.
  bwd.tolerances[DType::bf16] = {4e-2, 4e-2, 5e-5};
  bwd.tolerances[DType::f16] = {8e-3, 8e-3, 1e-6};
  reg.add_kernel<FusedLinearCrossEntropyBackward>(
      bwd,
      &fused_linear_cross_entropy_backward_cuda, &fused_linear_cross_entropy_backward_cuda_applicable);
}

}  // namespace opforge
