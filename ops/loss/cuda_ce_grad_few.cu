// cross_entropy_with_grad of a few rows with every row held in registers, reduction none: Note
// [ce with grad, rows in registers].
//
// Note [ce with grad, rows in registers] (16-byte packs, compute capability 9.0 on, reduction
// none): up to kCeGradFewRows rows, a row is one thread-block cluster with the softmax family's
// few-row plan (few_row_plan, ops/softmax/cluster_plan.h: `ranks` CTAs of 256 threads, 2, 4 or 8
// packs a thread, the fewest that hold a CTA's segment, at most 8 CTAs), as cross_entropy's
// few-row cluster kernel (Note [few-row cross_entropy cluster], cuda.cu) holds it; the gradient
// is then written from the registers, so the logits are read once and nothing is staged through
// shared memory (the one-read kernel of Note [ce with grad clusters] copies the row into shared
// memory with cp.async, made for many rows, three CTAs an SM).
//  - Every thread loads all its packs at once with the row's scalars (target, upstream gradient).
//    Without a softcap each value becomes exp(z - m_t), m_t the thread's max (cached_stats keeps
//    them), so the gradient is one FFMA an element, g (1 + 2 s lse) exp(m_t - lse) e - g eps
//    (minus g (1 - ls) at the target); with a softcap the capped z stay and the gradient takes its
//    exp and the cap's derivative 1 - (z / c)^2.
//  - The CTA's (max, sum, sum z) go to its shared memory; after one cluster barrier thread 0 of
//    every CTA merges the cluster's in rank order through distributed shared memory (every CTA
//    gets the same lse bits), rank 0 writes the row's lse and loss. One launch, programmatic
//    (Note [programmatic launch]); the same bits every run.
// f32 statistics; exps of 16-bit data through ex2.approx (exp_shifted), as the softmax family's;
// 64-bit offsets. cross_entropy_with_grad's cuda_cluster_vec16 impl takes it first for up to 64
// rows with reduction none (cuda_fused.cu; sum and mean run two passes there: Note [ce with grad,
// few rows in two passes]); OPFORGE_CE_GRAD_REGISTERS=0 turns it off (side-by-side timing).
// H200, bf16, us, shared-memory clusters or two kernels / this kernel: 16 x 4,096 4.22 / 3.76,
// 24 x 20,000 4.73 / 4.21 (docs/perf/gpu-h200-2026-11-30-round33.md); with 2 packs a thread where
// they hold the segment, 16 x 4,096 3.67 -> 3.44 (docs/perf/gpu-h200-2026-12-02-round37.md).
#include <cooperative_groups.h>

#include <cmath>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/loss/ce_forward.cuh"
#include "ops/loss/loss_cuda.cuh"
#include "ops/loss/loss_cuda.h"
#include "ops/softmax/cluster_plan.h"
#include "ops/softmax/cluster_row.cuh"
#include "ops/softmax/row_reduce.cuh"

namespace opforge {
namespace cuda::loss {
namespace {

namespace cg = cooperative_groups;
using rows::cached_stats;
using rows::cluster_row;
using rows::ClusterRow;
using rows::load_segment;
using rows::merge_all;
using rows::row_stats;
using rows::row_sum;
using rows::Stats;
using rows::tree_reduce;
using rows::UnitOf;

constexpr int kRanksMost = 8;  // the portable cluster size

// kCapped: a softcap is set (the values stay z for the cap's derivative).
template <class T, int kUnits, bool kCapped>
__global__ void __launch_bounds__(softmax::kClusterThreads, 2) ce_grad_regs_kernel(FusedArgs<T> p, int64_t seg_units) {
  programmatic_prologue();  // Note [programmatic launch]
  using U = UnitOf<T, true>;
  constexpr int W = U::width, kThreads = softmax::kClusterThreads;
  __shared__ Stats stats_scratch[32];
  __shared__ float sum_scratch[32];
  __shared__ Stats part;
  __shared__ float part_z;
  __shared__ float row_lse;
  cg::cluster_group cluster = cg::this_cluster();
  const ClusterRow seg = cluster_row(cluster, p.vocab / W, seg_units);
  const unsigned rank = seg.rank, ranks = seg.ranks;
  const int64_t row = seg.row, begin = seg.begin, end = seg.end;
  const T* x = p.logits + row * p.logits_stride;
  typename U::Raw raw[kUnits];
  load_segment<U, kUnits, kThreads>(x, seg, -INFINITY, raw);
  // The row's scalars, in flight with the row.
  const int64_t t = p.target[row * p.target_stride];
  const bool ignored = t == p.ignore_index, bad = !ignored && (t < 0 || t >= p.vocab);
  float g = ignored ? 0.0f : load_float(p.dloss, p.dloss_dtype, row * p.dloss_stride);
  const bool finisher = rank == 0 && threadIdx.x == 0;
  float zt = 0.0f;
  if (finisher && !ignored) zt = bad ? NAN : cap(to_f32(x[t]), p.softcap);

  float v[kUnits][W], zs[kUnits];
  widen_segment<U, kUnits, kThreads, kCapped>(raw, seg, p.softcap, v, zs);
  Stats st = cached_stats<T, !kCapped>(v);  // without a softcap v now holds exp(z - m_t)
  const float m_t = st.m;
  st = row_stats<T>(st, kThreads, stats_scratch);
  const bool smoothing = p.smoothing > 0.0f;  // uniform over the launch
  float z_cta = 0.0f;
  if (smoothing) z_cta = row_sum(tree_reduce(zs, [](float a, float b) { return a + b; }), kThreads, sum_scratch);
  if (threadIdx.x == 0) part = st, part_z = z_cta;
  cluster.sync();
  if (threadIdx.x == 0) {
    Stats all[kRanksMost];
    float z_row = 0.0f;
#pragma unroll
    for (int k = 0; k < kRanksMost; ++k)  // every remote load issued before the first is used
      if (k < int(ranks)) all[k] = *cluster.map_shared_rank(&part, unsigned(k));
    if (smoothing)
      for (unsigned k = 0; k < ranks; ++k) z_row += *cluster.map_shared_rank(&part_z, k);
    const Stats total = merge_all<T>(all, int(ranks));  // Note [max first]
    const float lse = total.m + logf(total.s);
    row_lse = lse;
    if (finisher) {
      p.lse[row * p.lse_stride] = lse;
      float loss = 0.0f;
      if (!ignored) {
        loss = (1.0f - p.smoothing) * (lse - zt) + p.z_scale * lse * lse;
        if (smoothing) loss += p.smoothing * lse - p.smoothing / float(p.vocab) * z_row;
      }
      p.loss[row * p.loss_stride] = loss;
    }
  }
  cluster_arrive();  // done with the other CTAs' shared memory
  __syncthreads();   // row_lse
  const float lse = row_lse;
  if (bad) g = NAN;

  // dz = g ((1 + 2 s lse) p - eps - (1 - ls) [j == t]), times the softcap's derivative.
  const float eps = p.smoothing / float(p.vocab);
  const float gs = g * (1.0f + 2.0f * p.z_scale * lse), gb = -g * eps, gbt = -g * (eps + 1.0f - p.smoothing);
  const float a = kCapped || m_t == -INFINITY ? 0.0f : gs * expf(m_t - lse);
  const float lse2 = lse * kLog2e, inv_cap = kCapped ? 1.0f / p.softcap : 0.0f;
  // The target's unit and lane (t_unit -1 for an ignored row or a bad target: no unit of it).
  const int64_t t_unit = ignored || bad ? -1 : t / W;
  const int t_lane = int(t - (t / W) * W);
  T* out = p.dlogits + row * p.dlogits_stride;
#pragma unroll
  for (int c = 0; c < kUnits; ++c) {
    const int64_t u = begin + threadIdx.x + int64_t(c) * kThreads;
    if (u >= end) continue;
    PackFloats<T> d;
    const bool target_unit = u == t_unit;  // once a row
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float add = target_unit && j == t_lane ? gbt : gb;
      if constexpr (kCapped) {
        const float z = v[c][j], r = z * inv_cap;
        d.v[j] = fmaf(gs, rows::exp_shifted<T>(z, lse, lse2), add) * (1.0f - r * r);
      } else {
        d.v[j] = fmaf(a, v[c][j], add);
      }
      if (ignored) d.v[j] = 0.0f;
    }
    store_pack_streaming(out + u * W, narrow_pack(d));
  }
  cluster_wait();  // no CTA leaves while another may still read its `part`
}

bool registers_enabled() {
  static const bool off = cuda::env_off("OPFORGE_CE_GRAD_REGISTERS");
  return !off;
}

}  // namespace
}  // namespace cuda::loss

bool ce_grad_few_rows_cuda(const Context& ctx, const TensorView& loss, const TensorView& lse,
                           const TensorView& dlogits, const TensorView& logits, const TensorView& target,
                           const TensorView& dloss, int64_t ignore_index, double label_smoothing,
                           double lse_square_scale, double softcap, std::string_view reduction) {
  using namespace cuda::loss;  // NOLINT
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (!registers_enabled() || rows <= 0 || rows > kCeGradFewRows || !cuda::cluster_rows_enabled()) return false;
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  if (props.cc_major < 9) return false;
  if (reduction != "none") return false;  // Note [ce with grad, few rows in two passes] (cuda_fused.cu)
  bool taken = false;
  cuda::DeviceGuard guard(ctx.device.index);
  cuda::dispatch_float(logits.dtype, "cross_entropy_with_grad", [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = cuda::Pack<T>::n;
    const int64_t units = vocab / W;
    cuda::softmax::FewRowPlan plan = cuda::softmax::few_row_plan(rows, units, props.sm_count, true);
    if (plan.ranks > kRanksMost) plan = cuda::softmax::few_row_plan(rows, units, props.sm_count, false);
    if (plan.ranks < 2 || plan.ranks > kRanksMost) return;
    const int64_t seg_units = (units + plan.ranks - 1) / plan.ranks;
    const bool capped = softcap > 0.0;
    const int held = cuda::softmax::held_units(plan, units);
    auto kernel = held == 2
                      ? (capped ? ce_grad_regs_kernel<T, 2, true> : ce_grad_regs_kernel<T, 2, false>)
                  : held == 4
                      ? (capped ? ce_grad_regs_kernel<T, 4, true> : ce_grad_regs_kernel<T, 4, false>)
                      : (capped ? ce_grad_regs_kernel<T, 8, true> : ce_grad_regs_kernel<T, 8, false>);
    if (!cuda::cluster_launch_fits(ctx.device.index, reinterpret_cast<const void*>(kernel), plan.ranks,
                                   cuda::softmax::kClusterThreads, 0))
      return;
    FusedArgs<T> p{};
    p.logits = logits.ptr<T>(), p.logits_stride = row_stride_of(logits);
    p.dlogits = dlogits.ptr<T>(), p.dlogits_stride = row_stride_of(dlogits);
    p.rows = rows, p.vocab = vocab;
    p.target = target.ptr<int64_t>(), p.target_stride = stride0(target);
    p.dloss = dloss.data, p.dloss_dtype = dloss.dtype, p.dloss_stride = stride0(dloss);
    p.loss = loss.ptr<float>(), p.loss_stride = stride0(loss);
    p.lse = lse.ptr<float>(), p.lse_stride = stride0(lse);
    p.ignore_index = ignore_index, p.smoothing = float(label_smoothing);
    p.z_scale = float(lse_square_scale), p.softcap = float(softcap);
    cuda::launch_cluster(ctx, "cross_entropy_with_grad registers cluster launch", kernel,
                         dim3(unsigned(rows * plan.ranks)), dim3(cuda::softmax::kClusterThreads), 0, plan.ranks, p,
                         seg_units);
    taken = true;
  });
  return taken;
}

}  // namespace opforge
