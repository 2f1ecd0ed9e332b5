// CUDA kernels of cross_entropy_with_grad: cross_entropy and its backward in one call (math: the
// ops' docs, ops/loss/loss.h).
//
// Technique. Separately, cross_entropy reads the [N, V] logits once and cross_entropy_backward
// reads them again and writes dlogits: three passes over N x V elements. The fused op needs two,
// one read and one write, which is the floor: 4.2 GB at 8,192 x 128,256 bf16, about 1.0 ms at an
// H200's 4.25 TB/s copy rate (the two ops took 0.593 + 1.689 ms there).
//  - Note [ce with grad clusters] (the plan: ops/loss/loss_cuda.h). A row is too long for one
//    CTA's shared memory (a 128,256-entry bf16 row is 256 KB; a CTA gets at most 227 KB), so a
//    thread-block cluster of `cluster` CTAs (sm_90) holds it: each CTA copies its slice of the row
//    from HBM into its shared memory (16-byte cp.async, every copy of the slice in flight at once:
//    no registers held, no loop of dependent loads), takes the slice's (max, sum of exp(z - max),
//    sum z) from shared memory, and leaves them in shared memory. After cluster.sync() thread 0 of
//    every CTA reads the cluster's partials through distributed shared memory in rank order and
//    merges them (every CTA gets the same bits), so every CTA knows the row's lse; the CTA of rank
//    0 writes lse and the row's loss. Then every CTA writes its slice's dlogits from its shared
//    copy: HBM sees one read of the logits and one write of dlogits. The cluster size is the
//    smallest that leaves three CTAs on an SM (a slice of at most a third of the SM's shared
//    memory: at 128,256 bf16, 4 CTAs of 62.6 KB; f32, 7 of 71.6 KB), so one CTA's copy-in overlaps
//    another's arithmetic and a third's stores. OPFORGE_CE_GRAD_CLUSTER=1..8 forces a size.
//  - Note [ce with grad, exp once]: without a softcap, the packed kernel keeps each element's
//    exp(z - max) in shared memory in place of z, so the gradient is one FFMA an element.
//  - Note [ce with grad, few rows]: up to 64 rows the plan's clusters leave most SMs idle (16 rows
//    of 32,000 bf16: 16 CTAs) and the launches around the kernel cost more than its traffic. There
//    the clusters take up to 8 CTAs, as many as fill the SMs (plan_for); a mean's kept rows are
//    counted by every CTA (one target a thread, __syncthreads_count) instead of by a launch before
//    it; and sum / mean's row losses are added by the rank-0 CTA of the last row to arrive (Note
//    [last block]) instead of by a launch after it: one launch in all. Few short rows without
//    options still run faster as the two kernels (two_passes_faster), and take them. Before all
//    this, the packed impl hands a reduction none of rows that fit 8 CTAs' registers to Note [ce
//    with grad, rows in registers] (cuda_ce_grad_few.cu), faster again, and sum / mean to Note
//    [ce with grad, few rows in two passes]. OPFORGE_CE_GRAD_FEW_ROWS=0 turns all this off
//    (side-by-side timing).
//  - Note [ce with grad, few rows in two passes]: where cross_entropy's forward takes Note
//    [few-row cross_entropy gather] (sum / mean of fewer rows than SMs, 16-byte packs), the packed
//    impl runs it and then cross_entropy_backward's kernel: two reads of the logits, but the
//    reduced loss comes from the gather's one arrival and one batch of loads, where the one-read
//    kernels finished each row in its cluster (barrier, distributed shared memory) and then sent
//    the rows' losses through a second arrival and round trip. Scratch builds that left stages
//    out of the register kernel (16 x 32,000 bf16, us): 6.45 whole, 5.46 without the last row's
//    sum, 3.61 without that and the cluster exchange. H200, bf16, us, register kernel (the plan
//    before) / two passes, same binary: 16 x 32,000 6.45 / 5.76, 16 x 128,256 9.70 / 8.29-8.45,
//    16 x 32,000 with every option 8.76 / 8.07, 8 x 40,000 with smoothing 7.50 / 5.47, 3 x 20,008
//    sum with every option 7.94 / 6.90, 12 x 5,000 5.24-5.41 / 5.12-5.24; reduction none keeps
//    the register kernel (16 x 4,096 3.65 against 4.01; docs/perf/gpu-h200-2026-12-02-round38.md).
//  - A CTA's threads own fixed units of the slice (unit u of thread t: u = t + k * 256) for the
//    copy, the statistics and the gradient, so each thread reads back only what it copied itself:
//    cp.async.wait_all (wait_group per quarter in the exp-once kernel) orders that, and no block
//    barrier is needed before the statistics.
//  - Reductions in a fixed order (warp butterflies, warps in order: ops/softmax/row_reduce.cuh,
//    then the cluster's ranks in order): deterministic for a given cluster size. f32 statistics,
//    exp per Note [element exp], accurate logf / tanhf, 64-bit offsets (row * row_stride).
//  - The gradient is cross_entropy_backward's: dz = g ((1 + 2 s lse) p - eps - (1 - ls) [j ==
//    target]) times the softcap's derivative, the target entry computed in f32 like every other
//    (from the unrounded lse, which the separate ops read back as f32: the same value).
//  - Upstream gradient on the device: g = dloss[row] (none), dloss[0] (sum), dloss[0] / kept rows
//    (mean: a one-block launch counts the kept rows into the workspace first, as
//    cross_entropy_backward does; few rows: each CTA counts). sum / mean: the per-row losses go to
//    the workspace and Note [loss row reduction] adds them in one more launch (few rows: in the
//    same launch). No host synchronization anywhere.
//  - cuda_cluster_vec16 (priority 300): 16-byte packs, needs aligned bases, V and row strides
//    multiples of the pack for logits and dlogits; cuda_cluster (200): single elements (plain
//    loads staged through registers, four in flight a thread), any layout; cuda (100):
//    cross_entropy's and cross_entropy_backward's kernels one after the other, for rows longer
//    than a cluster's shared memory (over 1.8 MB) or devices without clusters. The cluster
//    kernels' predicates name what rules them out (compute capability < 9.0, the row's length);
//    a device that cannot co-schedule the cluster (cudaOccupancyMaxActiveClusters = 0, e.g. a
//    small MIG slice) runs the two-kernel path from inside the cluster impl.
// Like cross_entropy's kernels, a target outside [0, V) other than ignore_index cannot be reported
// without a host synchronization: that row's loss and gradient are NaN.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/loss/ce_grad_kernels.cuh"
#include "ops/loss/loss_cuda.cuh"
#include "ops/loss/loss_cuda.h"

namespace opforge {
namespace cuda::loss {
namespace {

using namespace ce_grad;  // NOLINT: the kernels and their constants (kThreads, kMaxCluster)

enum class Red { none, sum, mean };
Red red_of(std::string_view r) { return r == "none" ? Red::none : r == "sum" ? Red::sum : Red::mean; }

// A launch of kThreads-thread CTAs in clusters of plan.cluster with plan.smem_bytes each.
struct ClusterLaunch {
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t config{};
  ClusterLaunch(const CeGradClusterPlan& plan, dim3 grid, cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(plan.cluster);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.gridDim = grid;
    config.blockDim = dim3(unsigned(kThreads));
    config.dynamicSmemBytes = size_t(plan.smem_bytes);
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points into attr
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Whether `kernel` can run clusters of plan.cluster CTAs with plan.smem_bytes each on the device
// (cudaOccupancyMaxActiveClusters > 0), asked once per (device, kernel, cluster, bytes). The first
// question per (device, kernel) also raises its dynamic shared memory limit to `budget_bytes`
// (smem_budget, which bounds every plan), so every later launch of it may use any plan's bytes, and
// asks for the largest shared memory carveout.
bool cluster_fits(int device, const void* kernel, const CeGradClusterPlan& plan, int64_t budget_bytes) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int64_t>, bool> known;
  static std::map<std::pair<int, const void*>, bool> raised;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, kernel, plan.cluster, plan.smem_bytes);
  if (auto it = known.find(key); it != known.end()) return it->second;
  if (!raised[{device, kernel}]) {
    OPFORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget_bytes)));
    // All of L1 as shared memory (the copies bypass L1): three CTAs of ~64 KB need ~195 KB of it.
    OPFORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            int(cudaSharedmemCarveoutMaxShared)));
    raised[{device, kernel}] = true;
  }
  ClusterLaunch launch(plan, dim3(unsigned(plan.cluster)), nullptr);
  int clusters = 0;
  const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config);
  if (status != cudaSuccess) cudaGetLastError();  // a refusal means "does not fit", not an error
  return known[key] = status == cudaSuccess && clusters > 0;
}

int forced_cluster() {
  static const int forced = [] {
    const char* e = std::getenv("OPFORGE_CE_GRAD_CLUSTER");
    return e ? std::clamp(std::atoi(e), 0, kMaxCluster) : 0;
  }();
  return forced;
}

// A CTA's dynamic shared memory at most: the opt-in limit less a margin for the kernel's static
// arrays (dynamic + static may not exceed the limit).
constexpr int64_t kSmemMargin = 2048;
int64_t smem_budget(const CudaDeviceProps& props) { return props.shared_per_block_optin - kSmemMargin; }

// Note [ce with grad, few rows]: the rules are ce_grad_few_row_cluster and
// ce_grad_two_passes_faster (ops/loss/loss_cuda.h); OPFORGE_CE_GRAD_FEW_ROWS=0 turns both off.
bool few_rows(int64_t rows) {
  static const bool off = env_off("OPFORGE_CE_GRAD_FEW_ROWS");
  return !off && rows > 0 && rows <= kCeGradFewRows;
}

// Few short rows without a softcap or label smoothing run faster as cross_entropy's few-row
// cluster kernel then cross_entropy_backward's streaming kernel than as this file's one-read
// cluster kernel, whose fixed costs (staging through shared memory, the cluster barrier, the last
// row's reduction) outweigh the second read there. H200, bf16, us, two kernels / one-read cluster:
// 16 x 4,096 4.10 / 5.25, 24 x 20,000 4.77 / 5.88, 12 x 5,000 6.15 / 6.82, 16 x 32,000 7.53 /
// 7.91; but 16 x 128,256 10.41 / 10.26 and 16 x 32,000 with every option 12.01 / 9.62
// (docs/perf/gpu-h200-2026-11-30-round32.md). A forced cluster size keeps the cluster kernel.
bool two_passes_faster(int64_t rows, int64_t vocab, double label_smoothing, double softcap) {
  return few_rows(rows) && forced_cluster() == 0 && ce_grad_two_passes_faster(rows, vocab, label_smoothing, softcap);
}

// The plan for a call: three CTAs an SM when the slices allow (a third of the SM's shared memory
// less the 1 KiB the system keeps per CTA and the kernel's static arrays), at most smem_budget;
// with few rows (Note [ce with grad, few rows]) clusters of up to 8 CTAs, as many as leave no SM
// without a CTA (16 rows: 8 CTAs a row rather than 1 at 32,000 bf16, 4 at 128,256).
CeGradClusterPlan plan_for(const TensorView& logits, bool vec) {
  const CudaDeviceProps& props = cuda_device_props(logits.device.index);
  const int64_t unit = vec ? 16 / logits.itemsize() : 1;
  auto plan_of = [&](int forced) {
    return ce_grad_cluster_plan(logits.size(1), logits.itemsize(), unit, props.cc_major, smem_budget(props),
                                props.shared_per_sm / 3 - kSmemMargin, forced);
  };
  CeGradClusterPlan plan = plan_of(forced_cluster());
  const int64_t rows = logits.size(0);
  if (plan.cluster > 0 && forced_cluster() == 0 && few_rows(rows)) {
    const int fill = ce_grad_few_row_cluster(rows, props.sm_count, plan.cluster);
    if (fill > plan.cluster) {
      const CeGradClusterPlan wider = plan_of(fill);
      if (wider.cluster == fill) plan = wider;
    }
  }
  return plan;
}

// cross_entropy then cross_entropy_backward (their vec16 kernels when the layouts allow), reading
// the lse just written: the `cuda` impl, and the cluster impls' way out on a device that cannot
// co-schedule the cluster.
void two_passes(const Context& ctx, const TensorView& loss, const TensorView& lse, const TensorView& dlogits,
                const TensorView& logits, const TensorView& target, const TensorView& dloss, int64_t ignore_index,
                double label_smoothing, double lse_square_scale, double softcap, std::string_view reduction) {
  const bool vec_fwd = cuda::pack_rows_problem(logits, logits.size(1)) == nullptr;
  const bool vec_bwd = vec_fwd && cuda::pack_rows_problem(dlogits, dlogits.size(1)) == nullptr;
  (vec_fwd ? cross_entropy_cuda_vec16 : cross_entropy_cuda)(ctx, loss, lse, logits, target, ignore_index,
                                                            label_smoothing, lse_square_scale, softcap, reduction);
  (vec_bwd ? cross_entropy_backward_cuda_vec16 : cross_entropy_backward_cuda)(
      ctx, dlogits, dloss, logits, target, lse, ignore_index, label_smoothing, lse_square_scale, softcap, reduction);
}

template <bool kVec>
void with_grad(const Context& ctx, const TensorView& loss, const TensorView& lse, const TensorView& dlogits,
               const TensorView& logits, const TensorView& target, const TensorView& dloss, int64_t ignore_index,
               double label_smoothing, double lse_square_scale, double softcap, std::string_view reduction) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  auto fallback = [&] {
    two_passes(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing, lse_square_scale,
               softcap, reduction);
  };
  if (rows == 0 || vocab == 0) return fallback();  // nothing to read: the two kernels' edge handling
  DeviceGuard guard(ctx.device.index);
  const CeGradClusterPlan plan = plan_for(logits, kVec);
  if (plan.cluster == 0) return fallback();  // the predicate has said why; reached only by direct calls
  if (kVec && few_rows(rows)) {
    if (reduction != "none" && ce_forward_gathers(logits))
      return fallback();  // Note [ce with grad, few rows in two passes]
    if (ce_grad_few_rows_cuda(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing,
                              lse_square_scale, softcap, reduction))
      return;  // Note [ce with grad, rows in registers]
  }
  if (two_passes_faster(rows, vocab, label_smoothing, softcap)) return fallback();
  const Red red = red_of(reduction);
  const int64_t budget = smem_budget(cuda_device_props(ctx.device.index));
  dispatch_float(logits.dtype, "cross_entropy_with_grad", [&](auto tag) {
    using T = decltype(tag);
    // Packs without a softcap: Note [ce with grad, exp once]; the element kernel's kPlain form for
    // the training default (no softcap, no label smoothing).
    void (*kernel)(FusedArgs<T>, int64_t) = nullptr;
    if constexpr (kVec)
      kernel = softcap == 0.0 ? &with_grad_once_kernel<T, T> : &with_grad_cluster_kernel<T, true, false>;
    else
      kernel = softcap == 0.0 && label_smoothing == 0.0 ? &with_grad_cluster_kernel<T, false, true>
                                                        : &with_grad_cluster_kernel<T, false, false>;
    if (!cluster_fits(ctx.device.index, reinterpret_cast<const void*>(kernel), plan, budget)) return fallback();
    // Workspace: the kept-row count (mean, unless counted in the CTAs), then the per-row losses
    // (sum / mean).
    const bool few = few_rows(rows);
    const int64_t count_bytes = red == Red::mean && !few ? 16 : 0;
    const int64_t loss_bytes = red == Red::none ? 0 : rows * int64_t(sizeof(float));
    char* ws = count_bytes + loss_bytes > 0 ? static_cast<char*>(cuda_workspace(ctx, count_bytes + loss_bytes)) : nullptr;
    float* kept = count_bytes > 0 ? reinterpret_cast<float*>(ws) : nullptr;
    float* per_row = red == Red::none ? loss.ptr<float>() : reinterpret_cast<float*>(ws + count_bytes);
    if (kept) {
      RowReduce r;
      r.rows = rows, r.labels = target.ptr<int64_t>(), r.labels_stride = stride0(target);
      r.ignore_index = ignore_index, r.divide = true, r.count_only = true, r.out = kept;
      launch_row_reduce(ctx, r, "cross_entropy_with_grad count launch");
    }
    FusedArgs<T> p{};
    p.logits = logits.ptr<T>(), p.logits_stride = row_stride_of(logits);
    p.dlogits = dlogits.ptr<T>(), p.dlogits_stride = row_stride_of(dlogits);
    p.rows = rows, p.vocab = vocab;
    p.target = target.ptr<int64_t>(), p.target_stride = stride0(target);
    p.dloss = dloss.data, p.dloss_dtype = dloss.dtype, p.dloss_stride = red == Red::none ? stride0(dloss) : 0;
    p.kept = kept;
    p.loss = per_row, p.loss_stride = red == Red::none ? stride0(loss) : 1;
    p.lse = lse.ptr<float>(), p.lse_stride = stride0(lse);
    p.ignore_index = ignore_index;
    p.smoothing = float(label_smoothing), p.z_scale = float(lse_square_scale), p.softcap = float(softcap);
    RowReduce reduce;
    if (red != Red::none) {
      reduce.losses = per_row, reduce.rows = rows, reduce.labels = target.ptr<int64_t>();
      reduce.labels_stride = stride0(target), reduce.ignore_index = ignore_index, reduce.divide = red == Red::mean;
      reduce.out = loss.ptr<float>();
    }
    if (few) {  // Note [ce with grad, few rows]
      p.count_in_block = red == Red::mean;
      if (red != Red::none) p.arrivals = cuda_grid_barrier(ctx), p.reduce = reduce;
    }
    const int64_t slice_units = plan.slice / UnitOf<T, kVec>::width;
    const int64_t clusters_x = std::min<int64_t>(rows, (int64_t(1) << 31) / kMaxCluster);
    launch_cluster(ctx, "cross_entropy_with_grad cluster kernel launch", kernel,
                   dim3(unsigned(clusters_x * plan.cluster), unsigned((rows + clusters_x - 1) / clusters_x)),
                   dim3(unsigned(kThreads)), size_t(plan.smem_bytes), plan.cluster, p, slice_units);
    if (red != Red::none && !few) launch_row_reduce(ctx, reduce, "cross_entropy_with_grad reduction launch");
  });
}

// The exp-once kernel over rows of f32 logits (ce_grad_rows, loss_cuda.h), TOut the gradient's dtype.
template <class TOut> void* rows_kernel() {
  return reinterpret_cast<void*>(&with_grad_once_kernel<float, TOut>);
}
void* rows_kernel_for(DType grad) {
  switch (grad) {
    case DType::f32: return rows_kernel<float>();
    case DType::f16: return rows_kernel<__half>();
    case DType::bf16: return rows_kernel<__nv_bfloat16>();
    default: return nullptr;
  }
}
CeGradClusterPlan rows_plan(int device, int64_t vocab) {
  const CudaDeviceProps& props = cuda_device_props(device);
  return ce_grad_cluster_plan(vocab, 4, 4, props.cc_major, smem_budget(props), props.shared_per_sm / 3 - kSmemMargin,
                              forced_cluster());
}

}  // namespace
}  // namespace cuda::loss

using namespace cuda::loss;  // NOLINT

bool ce_grad_rows_fit(const Context& ctx, int64_t vocab, DType grad_dtype) {
  void* kernel = rows_kernel_for(grad_dtype);
  if (kernel == nullptr || vocab <= 0 || vocab % 4 != 0) return false;
  cuda::DeviceGuard guard(ctx.device.index);
  const CeGradClusterPlan plan = rows_plan(ctx.device.index, vocab);
  return plan.cluster > 0 && cluster_fits(ctx.device.index, kernel, plan,
                                          smem_budget(cuda_device_props(ctx.device.index)));
}

void ce_grad_rows(const Context& ctx, const CeGradRows& a) {
  if (a.rows == 0) return;
  cuda::DeviceGuard guard(ctx.device.index);
  const CeGradClusterPlan plan = rows_plan(ctx.device.index, a.vocab);
  auto launch_with = [&](auto out_tag) {
    using TOut = decltype(out_tag);
    FusedArgs<float, TOut> p{};
    p.logits = a.logits, p.logits_stride = a.ld;
    p.dlogits = static_cast<TOut*>(a.grad), p.dlogits_stride = a.grad_ld;
    p.rows = a.rows, p.vocab = a.vocab;
    p.target = a.target, p.target_stride = a.target_stride;
    p.dloss = a.up, p.dloss_dtype = a.up_dtype, p.dloss_stride = a.up_stride;
    p.kept = nullptr;
    p.loss = a.loss, p.loss_stride = a.loss_stride;
    p.lse = a.lse, p.lse_stride = a.lse_stride;
    p.ignore_index = a.ignore_index;
    p.smoothing = a.smoothing, p.z_scale = 0.0f, p.softcap = 0.0f;
    const int64_t clusters_x = std::min<int64_t>(a.rows, (int64_t(1) << 31) / kMaxCluster);
    ClusterLaunch launch(plan, dim3(unsigned(clusters_x * plan.cluster), unsigned((a.rows + clusters_x - 1) / clusters_x)),
                         cuda::stream_of(ctx));
    const cudaError_t status = cudaLaunchKernelEx(&launch.config, &with_grad_once_kernel<float, TOut>, p,
                                                  int64_t(plan.slice / 4));
    if (status != cudaSuccess) {
      cudaGetLastError();
      cuda::throw_cuda_error("fused_linear_cross_entropy_with_grad cluster kernel launch", status);
    }
  };
  switch (a.grad_dtype) {
    case DType::f32: return launch_with(float{});
    case DType::f16: return launch_with(__half{});
    case DType::bf16: return launch_with(__nv_bfloat16{});
    default: cuda::throw_cuda_error("fused_linear_cross_entropy_with_grad: gradient dtype", cudaErrorInvalidValue);
  }
}

void cross_entropy_with_grad_cuda(const Context& ctx, const TensorView& loss, const TensorView& lse,
                                  const TensorView& dlogits, const TensorView& logits, const TensorView& target,
                                  const TensorView& dloss, int64_t ignore_index, double label_smoothing,
                                  double lse_square_scale, double softcap, std::string_view reduction) {
  two_passes(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing, lse_square_scale,
             softcap, reduction);
}
void cross_entropy_with_grad_cuda_cluster(const Context& ctx, const TensorView& loss, const TensorView& lse,
                                          const TensorView& dlogits, const TensorView& logits,
                                          const TensorView& target, const TensorView& dloss, int64_t ignore_index,
                                          double label_smoothing, double lse_square_scale, double softcap,
                                          std::string_view reduction) {
  with_grad<false>(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing, lse_square_scale,
                   softcap, reduction);
}
void cross_entropy_with_grad_cuda_cluster_vec16(const Context& ctx, const TensorView& loss, const TensorView& lse,
                                                const TensorView& dlogits, const TensorView& logits,
                                                const TensorView& target, const TensorView& dloss,
                                                int64_t ignore_index, double label_smoothing,
                                                double lse_square_scale, double softcap,
                                                std::string_view reduction) {
  with_grad<true>(ctx, loss, lse, dlogits, logits, target, dloss, ignore_index, label_smoothing, lse_square_scale,
                  softcap, reduction);
}

const char* cross_entropy_with_grad_cuda_applicable(const TensorView& loss, const TensorView& lse,
                                                    const TensorView& dlogits, const TensorView& logits,
                                                    const TensorView& target, const TensorView& dloss, int64_t i,
                                                    double ls, double z, double c, std::string_view r) {
  if (const char* why = cross_entropy_cuda_applicable(loss, lse, logits, target, i, ls, z, c, r)) return why;
  return cross_entropy_backward_cuda_applicable(dlogits, dloss, logits, target, lse, i, ls, z, c, r);
}
const char* cross_entropy_with_grad_cuda_cluster_applicable(const TensorView& loss, const TensorView& lse,
                                                            const TensorView& dlogits, const TensorView& logits,
                                                            const TensorView& target, const TensorView& dloss,
                                                            int64_t i, double ls, double z, double c,
                                                            std::string_view r) {
  if (const char* why = cross_entropy_with_grad_cuda_applicable(loss, lse, dlogits, logits, target, dloss, i, ls, z,
                                                                c, r))
    return why;
  return plan_for(logits, false).why;
}
const char* cross_entropy_with_grad_cuda_cluster_vec16_applicable(
    const TensorView& loss, const TensorView& lse, const TensorView& dlogits, const TensorView& logits,
    const TensorView& target, const TensorView& dloss, int64_t i, double ls, double z, double c,
    std::string_view r) {
  if (const char* why = cross_entropy_with_grad_cuda_applicable(loss, lse, dlogits, logits, target, dloss, i, ls, z,
                                                                c, r))
    return why;
  if (const char* why = cuda::pack_rows_problem(logits, logits.size(1))) return why;
  if (const char* why = cuda::pack_rows_problem(dlogits, dlogits.size(1))) return why;
  return plan_for(logits, true).why;
}

void register_ce_with_grad_cuda(Registry& reg) {
  reg.add_kernel<CrossEntropyWithGrad>(
      cuda_kernel_desc("cuda_cluster_vec16", 300,
                       "one read of each row: a cluster of CTAs holds it in shared memory (16-byte cp.async), "
                       "statistics merged through distributed shared memory, dlogits written from the copy "
                       "(without a softcap: from each element's exp, kept in place of it); up to 64 rows one launch "
                       "on clusters that fill the SMs, the row held in registers where 8 CTAs' registers hold it",
                       false),
      &cross_entropy_with_grad_cuda_cluster_vec16, &cross_entropy_with_grad_cuda_cluster_vec16_applicable);
  reg.add_kernel<CrossEntropyWithGrad>(
      cuda_kernel_desc("cuda_cluster", 200,
                       "any layout: one read of each row into a cluster's shared memory, single elements", false),
      &cross_entropy_with_grad_cuda_cluster, &cross_entropy_with_grad_cuda_cluster_applicable);
  reg.add_kernel<CrossEntropyWithGrad>(
      cuda_kernel_desc("cuda", 100,
                       "cross_entropy's kernel then cross_entropy_backward's (two reads of the logits): any row "
                       "length, no clusters",
                       false),
      &cross_entropy_with_grad_cuda, &cross_entropy_with_grad_cuda_applicable);
}

}  // namespace opforge
