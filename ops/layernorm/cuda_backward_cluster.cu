// layer_norm_backward's few-row CUDA kernel: the whole problem in one thread-block cluster.
//
// Note [few-row layer_norm backward cluster]: with a handful of rows (16 tokens) the cooperative
// ring kernel (cuda_fast.cu) gives a few SMs a row each, then every block of the grid meets at a
// grid barrier to reduce dw and db. Here, as rms_norm's Note [few-row backward cluster]
// (ops/norm/cuda_backward.cu, whose plan and cross-CTA sums this kernel shares), one cluster of
// C <= 16 CTAs (above 8 from 8 rows on) takes the problem cut by columns: CTA c owns the packs [c * P, (c + 1) * P) of every
// row, thread (g, p) holds pack p of rows g, g + G (at most two rows a thread) with x, dy and w in
// registers, all loaded at once. Then:
//  - the four sums of each row about c = x[0] (d, d^2, g and g d with d = x - c, g = dy * w; Note
//    [layer_norm backward in one reduction], cuda_backward_bulk.cu) over the CTA's columns, and
//    across the CTAs through distributed shared memory after one cluster barrier, added in rank
//    order (every CTA gets the same bits);
//  - the test of Note [shifted sums] on the totals (the same in every CTA, so the cluster takes
//    the same branch): rows whose first element is an outlier reduce again about their f32 mean
//    (sums of d, d^2, g d), through a second cluster exchange;
//  - dx from registers, xhat = ((x - c) - shift) * rstd (Note [backward centring],
//    cuda_backward.cuh); dw and db of the CTA's columns are complete inside the CTA (it holds
//    every row of them): the row groups' sums are added in group order in shared memory and
//    written once, dw and db in one pass where a thread holds one row (`cluster_column_sums` of
//    two quantities). No workspace, no grid barrier, one launch; the bits depend only on the
//    inputs and the shape.
// The warps' row sums go through Note [reduce-scatter block sum] (6 shuffles a warp for the four
// sums instead of 20), the arrive after the remote reads is relaxed (cluster_arrive), and dw / db
// share one column-sum pass: 16 x 4,096 bf16 on an H200 4.60 -> 4.14 us, 1 x 4,096 2.75 -> 2.51
// (docs/perf/gpu-h200-2026-11-29-round21.md). The outlier test of each row runs in the threads that
// hold its totals, so the barrier that publishes them also publishes the verdict (one block-wide
// OR-barrier fewer: 4.28 -> 4.22 us, docs/perf/gpu-h200-2026-12-02-round37.md).
// Taken up to 16 rows (more go to the ring kernel, which spreads them over more SMs) with at most
// two rows a thread; compute capability 9.0
// on (Note [cluster launch]); OPFORGE_CUDA_CLUSTER_ROWS=0 turns it off with the other few-row
// cluster kernels (tuning). Assumes what the cuda_vec16_async predicate checks (16-byte aligned
// rows, hidden a multiple of the pack, w contiguous and aligned). f32 arithmetic, int64 row
// offsets, launched programmatically on ctx.stream, no host synchronization.
#include "ops/layernorm/cuda_backward.cuh"

namespace opforge::cuda::layernorm_fast {
namespace {

namespace cg = cooperative_groups;
using norm::ClusterPlan;
using norm::ClusterRowSums;
using norm::kClusterMaxThreads;

template <class T, int RT>
__global__ void __launch_bounds__(kClusterMaxThreads)
    layer_norm_bwd_cluster_kernel(BwdArgs<T> a, int packs, int padded, int groups, T* dw_out, int64_t dw_stride,
                                  T* db_out, int64_t db_stride) {
  constexpr int N = Pack<T>::n;
  __shared__ ClusterRowSums<4, RT> sh;        // d, d^2, g, g d about x[0]
  __shared__ ClusterRowSums<4, RT> centred;   // d, d^2, g d about the mean (outlier rows only)
  __shared__ float stage[kClusterMaxThreads * N];  // the column sums, G x N x P' floats
  programmatic_prologue();  // Note [programmatic launch]
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const int n_packs = int(a.hidden / N);
  const int g = threadIdx.x / padded, pl = threadIdx.x % padded;
  const int pack = int(rank) * packs + pl;
  const bool col_live = pl < packs && pack < n_packs;
  const int col = pack * N;
  const float inv_h = 1.0f / float(a.hidden);
  auto live = [&](int s) { return col_live && g + int64_t(s) * groups < a.rows; };
  auto row_of = [&](int s) { return g + int64_t(s) * groups; };

  Pack<T> wp, xp[RT], gp[RT];
  float c[RT];  // the point each row is reduced about
  if (col_live) wp = load_pack_readonly(a.w + col);
#pragma unroll
  for (int s = 0; s < RT; ++s) {
    c[s] = 0.0f;
    if (live(s)) {
      const T* x = a.x + row_of(s) * a.x_stride;
      xp[s] = load_pack(x + col);
      gp[s] = load_pack(a.dy + row_of(s) * a.dy_stride + col);
      c[s] = to_f32(x[0]);
    }
  }
  // f(s, j, d, g) over this thread's elements of its live rows, d = x - c and g = dy * w.
  auto each = [&](const float (&about)[RT], auto&& f) {
    const PackFloats<T> wf = widen_pack(wp);
#pragma unroll
    for (int s = 0; s < RT; ++s) {
      if (!live(s)) continue;
      const PackFloats<T> xf = widen_pack(xp[s]), gf = widen_pack(gp[s]);
#pragma unroll
      for (int j = 0; j < N; ++j) f(s, j, xf.v[j] - about[s], gf.v[j] * wf.v[j]);
    }
  };
  float sums[RT][4];
#pragma unroll
  for (int s = 0; s < RT; ++s) sums[s][0] = sums[s][1] = sums[s][2] = sums[s][3] = 0.0f;
  each(c, [&](int s, int, float d, float gw) { add_row_sums(sums[s], d, gw); });
  // Note [shifted sums]: an outlier first element (or a NaN) reduces again about the f32 mean. The
  // test of a row from its sums of d and d^2, in the order centred_row takes them.
  auto outlier_sums = [&](float d, float d2) {
    const float shift = d * inv_h;
    return !(d * shift <= 8.0f * fmaxf(d2 - d * shift, 0.0f));
  };
  auto outlier = [&](int64_t row) { return outlier_sums(sh.total[row][0], sh.total[row][1]); };
  __shared__ int any_outlier;
  if (threadIdx.x == 0) any_outlier = 0;  // ordered before the tests by the barriers below
  norm::cta_row_sums(sums, sh, groups, padded, a.rows);
  cluster.sync();
  // Thread 4r + v holds sum v of row r (V = 4 divides the warp): lane 4r tests row r with its
  // neighbour's sum of d^2, so the block barrier that publishes the totals publishes the verdict.
  const float total = norm::cluster_row_totals(cluster, sh, groups, a.rows);
  const float total_d2 = __shfl_down_sync(0xffffffffu, total, 1);
  const int rows_here = int(a.rows < int64_t(groups) * RT ? a.rows : int64_t(groups) * RT);
  if (threadIdx.x % 4 == 0 && int(threadIdx.x) < 4 * rows_here && outlier_sums(total, total_d2)) any_outlier = 1;
  cluster_arrive();  // done with the other CTAs' shared memory
  __syncthreads();   // sh.total, any_outlier
  const bool again = any_outlier != 0;
  if (again) {  // the same in every CTA of the cluster (the totals are)
    float about[RT], part[RT][4];
    bool redo[RT];
#pragma unroll
    for (int s = 0; s < RT; ++s) {
      about[s] = c[s];
      part[s][0] = part[s][1] = part[s][2] = part[s][3] = 0.0f;
      redo[s] = live(s) && outlier(row_of(s));
      if (redo[s]) about[s] = c[s] + sh.total[row_of(s)][0] * inv_h;
    }
    each(about, [&](int s, int, float d, float gw) {
      if (!redo[s]) return;
      part[s][0] += d;
      part[s][1] += d * d;
      part[s][3] += gw * d;
    });
    norm::cta_row_sums(part, centred, groups, padded, a.rows);
    cluster_wait();   // the first exchange's barrier
    cluster.sync();   // every CTA's centred partials written
    norm::cluster_row_totals(cluster, centred, groups, a.rows);
    cluster_arrive();
    __syncthreads();  // centred.total
#pragma unroll
    for (int s = 0; s < RT; ++s) c[s] = about[s];
  }

  // dx and dw first. One row a thread: db (a sum of dy alone) beside dw, and both column sums in
  // one pass where the stage holds both (blocks up to half the largest). Two rows a thread: db
  // after dw's column sums, so that its accumulators are not live beside dw's (the 1024-thread
  // launch bound leaves 64 registers a thread).
  constexpr bool kJoint = RT == 1;
  float acc[2][N];  // dw, db
#pragma unroll
  for (int j = 0; j < N; ++j) acc[0][j] = acc[1][j] = 0.0f;
#pragma unroll
  for (int s = 0; s < RT; ++s) {
    if (!live(s)) continue;
    const int64_t row = row_of(s);
    const float* t = sh.total[row];
    float cs[4] = {t[0], t[1], t[2], t[3]};
    if (again && outlier(row)) {  // sum g does not depend on the point
      const float* u = centred.total[row];
      cs[0] = u[0], cs[1] = u[1], cs[3] = u[3];
    }
    const CentredRow st = centred_row(cs, inv_h);
    const float rstd = rstd_of<T>(st.m2, a.hidden, a.eps);
    const float mean_g = cs[2] * inv_h, mean_gx = st.gd * rstd * inv_h, shift = st.shift;
    const PackFloats<T> xf = widen_pack(xp[s]), gf = widen_pack(gp[s]), wf = widen_pack(wp);
    PackFloats<T> out;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float xhat = ((xf.v[j] - c[s]) - shift) * rstd;
      out.v[j] = rstd * (gf.v[j] * wf.v[j] - mean_g - xhat * mean_gx);
      acc[0][j] += gf.v[j] * xhat;
      if constexpr (kJoint) acc[1][j] += gf.v[j];
    }
    store_pack(a.dx + row * a.dx_stride + col, narrow_pack(out));
  }
  const int first_pack = int(rank) * packs;
  auto store = [&](int m, int k, float v) {
    if (m == 0) dw_out[int64_t(k) * dw_stride] = from_f32<T>(v);
    else db_out[int64_t(k) * db_stride] = from_f32<T>(v);
  };
  if (kJoint && 2 * int(blockDim.x) <= kClusterMaxThreads) {
    norm::cluster_column_sums(acc, stage, g, pl, padded, packs, groups, first_pack, n_packs, store);
  } else {
    norm::cluster_column_sums(acc[0], stage, g, pl, padded, packs, groups, first_pack, n_packs,
                              [&](int k, float v) { store(0, k, v); });
    if constexpr (!kJoint) {
#pragma unroll
      for (int s = 0; s < RT; ++s) {
        if (!live(s)) continue;
        const PackFloats<T> gf = widen_pack(gp[s]);
#pragma unroll
        for (int j = 0; j < N; ++j) acc[1][j] += gf.v[j];
      }
    }
    norm::cluster_column_sums(acc[1], stage, g, pl, padded, packs, groups, first_pack, n_packs,
                              [&](int k, float v) { store(1, k, v); });
  }
  cluster_wait();  // no CTA leaves while another may still read its partials
}

}  // namespace

// Rows up to which the cluster is taken. Beyond, the ring kernel spreads the rows over more SMs
// than the cluster's 8 and wins: H200, 48 x 1,024, f32 5.9 against 7.8 us, bf16 6.5 against 8.9;
// at 16 x 4,096 bf16 the cluster took 4.6 against 6.8 (4.14 since round 21), at 16 x 8,192 6.0
// against 9.6 (16 CTAs; docs/perf/gpu-h200-2026-11-28-round20.md).
constexpr int64_t kMaxRows = 16;

template <class T>
bool launch_bwd_cluster(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw, const TensorView& db) {
  if (!cluster_rows_enabled() || a.rows > kMaxRows) return false;
  const void* const kernels[2] = {reinterpret_cast<const void*>(layer_norm_bwd_cluster_kernel<T, 1>),
                                  reinterpret_cast<const void*>(layer_norm_bwd_cluster_kernel<T, 2>)};
  static const bool wide = norm::allow_wide_clusters(kernels[0]) && norm::allow_wide_clusters(kernels[1]);
  const ClusterPlan c = norm::fitting_cluster_plan(ctx.device.index, a.rows, a.hidden / Pack<T>::n, kernels, wide);
  if (c.ranks == 0) return false;
  auto kernel = c.rows_per_thread == 1 ? layer_norm_bwd_cluster_kernel<T, 1> : layer_norm_bwd_cluster_kernel<T, 2>;
  launch_cluster(ctx, "layer_norm_backward_cuda_vec16_async cluster launch", kernel, dim3(unsigned(c.ranks)),
                 dim3(unsigned(c.groups * c.padded)), 0, c.ranks, a, c.packs, c.padded, c.groups, dw.ptr<T>(),
                 int64_t(dw.stride(0)), db.ptr<T>(), int64_t(db.stride(0)));
  return true;
}

template bool launch_bwd_cluster<float>(const Context&, const BwdArgs<float>&, const TensorView&, const TensorView&);
template bool launch_bwd_cluster<__half>(const Context&, const BwdArgs<__half>&, const TensorView&, const TensorView&);
template bool launch_bwd_cluster<__nv_bfloat16>(const Context&, const BwdArgs<__nv_bfloat16>&, const TensorView&,
                                                const TensorView&);

}  // namespace opforge::cuda::layernorm_fast
