// layer_norm_backward's many-row CUDA kernel: rows streamed through shared memory by bulk copies,
// one block reduction a row.
//
// Note [layer_norm backward in one reduction]: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
// with g = dy * w and xhat = (x - mean) * rstd needs, per row, the mean, the centred sum of squares
// M2 and the sums of g and of g * (x - mean). With d = x - x[0] (x[0] read from the row's stage by
// every thread) the four sums of d, d^2, g and g * d in one block reduction give them all:
// mean = x[0] + sum d / n, M2 = sum d^2 - (sum d)^2 / n, sum g (x - mean) = sum g d - (sum d / n)
// sum g. The cancellation is that of Note [shifted sums] (cuda_fast.cu), and so is the test: while
// n (mean - x[0])^2 <= 8 M2 (decided on the reduced sums, block-uniform) the result is as
// accurate as the centred form; otherwise (an outlier first element) a second reduction of the
// sums of d' = x - mean, d'^2 and g d' over the stage, which is still in shared memory, corrects
// them. The ring kernel of cuda_fast.cu reduces every row twice (the mean, then the centred sums).
// The row's reduction is Note [reduce-scatter block sum] (src/backends/cuda/cuda_launch.cuh): one
// barrier and 6 shuffles a warp for the four sums, where four full butterflies and two barriers
// were a third of the kernel's instructions; dx is taken as rstd g + nb xhat + ne with the row's
// constants folded (nb = -rstd mean(g xhat), ne = -rstd mean(g)). This kernel issues more than
// it waits in 16-bit types (f32, twice the bytes for the same instructions, was at 91% of copy
// while bf16 was at 64%): on an H200 at 16,384 x 4,096 the two took bf16 149.2 -> 127.0 us (64.5%
// -> 76% of copy), f16 144.2 -> 119.3 us (docs/perf/gpu-h200-2026-11-29-round21.md).
//
// The pipeline is Note [bulk-copy row pipeline] (ops/norm/cuda_backward_bulk.cu): a block keeps a
// ring of up to 4 stages, each one row of x and of dy filled by two 1-D bulk copies completing on
// the stage's mbarrier; thread 0 refills the previous row's stage after the row's reduction (whose
// block barriers follow every thread's reads of it); the packs are read from shared memory for
// the sums and again for dx, so the registers hold w in f32 and the f32 dw and db accumulators.
// In bf16 at one pack a thread the row stays in registers instead, d = x - x[0] and dy in f32, and
// thread 0 refills the row's own stage after its reduction (Note [held row], ops/norm/
// cuda_backward.cuh: 115.6 -> 112.5 us at 16,384 x 4,096 on an H200, 85% of copy).
// 512 threads x 1 pack (two blocks an SM at 64 registers) or x 2 packs (hidden up to 8,192 in
// 16-bit types, 4,096 in f32). Rows in the order of Note [row order]. dw and db: each block writes
// one row of partials [G, 2 * hidden] (dw then db), a grid barrier, then the fixed-order column sums
// of Note [one-launch dw] (ops/norm/cuda_backward.cu): the bits depend only on the inputs and the
// device, no float atomics. Where x and dy read again are no more bytes than those partial rows
// (up to about 1,024 rows of 4,096 in 16-bit types on an H200), each block writes its rows'
// (c, rstd, nshift) instead and dw and db are summed by columns after the barrier (Note [column
// dw], ops/norm/cuda_backward.cuh): bf16 1,024 x 4,096 17.6-18.7 -> 17.3-18.3 us.
//
// Assumes what the cuda_vec16_async predicate checks: every row 16-byte aligned (base and stride),
// hidden a multiple of the 16-byte pack (a row is a whole number of 16-byte units, as a bulk copy
// needs), w contiguous and aligned. f32 arithmetic, int64 row offsets, launched on ctx.stream, no
// host synchronization. OPFORGE_CUDA_LN_ROWS_BULK=0 leaves every call to the ring kernel (tuning).
#include <type_traits>

#include "ops/layernorm/cuda_backward.cuh"

namespace opforge::cuda::layernorm_fast {
namespace {

using norm::block_rows;
using norm::BlockRows;
using norm::BulkCache;
using norm::BulkPlan;
using norm::kBulkMaxStages;
using norm::kBwdMaxThreads;
using norm::plan_bulk;
using norm::stage_pack;

// Rows per SM from which this kernel is taken, and from which f32 goes back to the ring kernel.
// H200, hidden 4,096, this kernel against the ring in one call (docs/perf/gpu-h200-2026-11-28-round19.md):
// 1,024 rows (7.75 an SM) bf16 20.6 / 21.7 us, f32 20.8 / 22.7; 16,384 rows bf16 149.2 / 162.0,
// f16 140.6 / 156.6, but f32 224.2 / 211.6 (the ring holds two packs a thread in registers).
constexpr int64_t kMinRowsPerSm = 4;
constexpr int64_t kF32RingRowsPerSm = 16;

// The row statistics Note [column dw] keeps a row: c, rstd, nshift (xhat = (x - c) rstd + nshift).
constexpr int kRowStats = 3;

// Phase 2 under Note [column dw] (ops/norm/cuda_backward.cuh): dw = sum dy * xhat, db = sum dy,
// each term as phase 1 forms it from the row's statistics `stats` [rows, 3].
template <class T>
__device__ __forceinline__ void ln_dw_db_by_columns(const BwdArgs<T>& a, const float* stats, float* red, T* dw_out,
                                                    int64_t dw_stride, T* db_out, int64_t db_stride) {
  constexpr int N = Pack<T>::n;
  struct Item {
    Pack<T> x, g;
    float c, rstd, nshift;
  };
  auto load = [&](int64_t row, int pack) {
    Item it;
    it.x = load_pack_readonly(a.x + row * a.x_stride + int64_t(pack) * N);
    it.g = load_pack_readonly(a.dy + row * a.dy_stride + int64_t(pack) * N);
    it.c = __ldcg(stats + row * kRowStats);
    it.rstd = __ldcg(stats + row * kRowStats + 1);
    it.nshift = __ldcg(stats + row * kRowStats + 2);
    return it;
  };
  auto add = [](const Item& it, float (&acc)[2][N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float gy = to_f32(it.g.v[j]);
      acc[0][j] = fmaf(gy, fmaf(to_f32(it.x.v[j]) - it.c, it.rstd, it.nshift), acc[0][j]);
      acc[1][j] += gy;
    }
  };
  norm::column_sums<T, 2, 4>(a.rows, int(a.hidden / N), red, load, add, [&](int m, int64_t col, float total) {
    if (m == 0) dw_out[col * dw_stride] = from_f32<T>(total);
    else db_out[col * db_stride] = from_f32<T>(total);
  });
}

// kColumns: Note [column dw]; `partial` then holds the rows' statistics [rows, 3].
// kHold: Note [held row] (ops/norm/cuda_backward.cuh), d = x - x[0] and dy kept in f32 registers
// from the sums to dx.
template <class T, int K, bool kColumns, bool kHold>
__global__ void __launch_bounds__(kBwdMaxThreads, K == 1 ? 2 : 1)
    layer_norm_bwd_bulk_kernel(BwdArgs<T> a, float* partial, int64_t rows_per_block, bool strided,
                               int stages, unsigned* barrier, T* dw_out, int64_t dw_stride, T* db_out,
                               int64_t db_stride) {
  constexpr int N = Pack<T>::n;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kBulkMaxStages];
  __shared__ float scratch[2 * 4 * 32];
  __shared__ float slice[kBwdMaxThreads];
  unsigned turn = 0;  // block_sum_once's scratch half
  const int n_packs = int(a.hidden / N);
  const int threads = blockDim.x;
  const uint32_t row_bytes = uint32_t(a.hidden) * uint32_t(sizeof(T));
  const uint32_t stage_bytes = 2 * row_bytes;  // x, then dy
  const float inv_h = 1.0f / float(a.hidden);
  const BlockRows rows = block_rows(a.rows, rows_per_block, strided);  // Note [row order]
  programmatic_prologue();  // Note [programmatic launch]

  // Thread 0: the bulk copies of `row` into stage s (none past the block's rows).
  auto issue = [&](int64_t row, int s) {
    if (row >= rows.end) return;
    const T* const src[2] = {a.x + row * a.x_stride, a.dy + row * a.dy_stride};
    norm::fill_stage(ring + size_t(s) * stage_bytes, &full[s], row_bytes, src);
  };
  norm::start_ring(full, stages, rows, issue);

  float wf[K][N], dw[K][N], db[K][N];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = threadIdx.x + k * threads;
    if (i < n_packs) {
      const Pack<T> wp = load_pack_readonly(a.w + i * N);
#pragma unroll
      for (int j = 0; j < N; ++j) wf[k][j] = to_f32(wp.v[j]);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) dw[k][j] = db[k][j] = 0.0f;
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them

  int s = 0;
  unsigned parity = 0;
  for (int64_t row = rows.begin; row < rows.end; row += rows.step) {  // block-uniform
    bulk_wait(&full[s], parity);
    const unsigned char* stage = ring + size_t(s) * stage_bytes;
    const float x0 = to_f32(*reinterpret_cast<const T*>(stage));
    // f(k, j, d, dy) over this thread's elements of the row (pack k, element j), d = x - c.
    auto each = [&](float c, auto&& f) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = threadIdx.x + k * threads;
        if (i < n_packs) {
          const Pack<T> xp = stage_pack<T>(stage, uint32_t(i) * 16u);
          const Pack<T> gp = stage_pack<T>(stage, row_bytes + uint32_t(i) * 16u);
#pragma unroll
          for (int j = 0; j < N; ++j) f(k, j, to_f32(xp.v[j]) - c, to_f32(gp.v[j]));
        }
      }
    };
    float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // sum d, sum d^2, sum g, sum g d; d = x - x[0], g = dy * w
    float hd[kHold ? K : 1][N], hy[kHold ? K : 1][N];  // kHold: d and dy of this thread's packs
    each(x0, [&](int k, int j, float d, float dy) {
      if constexpr (kHold) hd[k][j] = d, hy[k][j] = dy;
      add_row_sums(sums, d, dy * wf[k][j]);
    });
    block_sum_once<4>(sums, scratch, turn);
    // Every thread has finished the previous row, whose stage it read last (the reduction's block
    // barrier): refill that stage. Holding the row, every thread is done with this row's stage.
    if constexpr (kHold) {
      if (threadIdx.x == 0) issue(row + stages * rows.step, s);
    } else {
      if (threadIdx.x == 0 && row != rows.begin)
        issue(row + (stages - 1) * rows.step, s == 0 ? stages - 1 : s - 1);
    }
    // Note [backward centring]: about c = x[0], or, for an outlier x[0], about the f32 mean.
    float c = x0;
    CentredRow st = centred_row(sums, inv_h);
    if (!(sums[0] * st.shift <= 8.0f * st.m2)) {  // block-uniform; an outlier x[0] (or a NaN)
      c = x0 + st.shift;
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // sum d, d^2, g d with d = x - c
      auto add_part = [&](float d, float g) {
        part[0] += d;
        part[1] += d * d;
        part[2] += g * d;
      };
      if constexpr (kHold) {
#pragma unroll
        for (int k = 0; k < K; ++k)
          if (threadIdx.x + k * threads < n_packs)
#pragma unroll
            for (int j = 0; j < N; ++j) {
              hd[k][j] -= st.shift;
              add_part(hd[k][j], hy[k][j] * wf[k][j]);
            }
      } else {
        each(c, [&](int k, int j, float d, float dy) { add_part(d, dy * wf[k][j]); });
      }
      block_sum_once<4>(part, scratch, turn);
      const float cs[4] = {part[0], part[1], sums[2], part[2]};  // sum g does not depend on c
      st = centred_row(cs, inv_h);
    }
    const float rstd = rstd_of<T>(st.m2, a.hidden, a.eps);
    const float mean_g = sums[2] * inv_h;
    const float mean_gx = st.gd * rstd * inv_h;
    // dx = rstd g - rstd mean_gx xhat - rstd mean_g, xhat = (x - c) rstd - shift rstd.
    const float nb = -rstd * mean_gx, ne = -rstd * mean_g, nshift = -st.shift * rstd;
    if (kColumns && threadIdx.x == 0) {
      partial[row * kRowStats] = c;
      partial[row * kRowStats + 1] = rstd;
      partial[row * kRowStats + 2] = nshift;
    }
    T* dx = a.dx + row * a.dx_stride;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = threadIdx.x + k * threads;
      if (i >= n_packs) continue;
      Pack<T> xp, gp;
      if constexpr (!kHold) {
        xp = stage_pack<T>(stage, uint32_t(i) * 16u);  // again: no packs held across
        gp = stage_pack<T>(stage, row_bytes + uint32_t(i) * 16u);  // the reduction
      }
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float gy = kHold ? hy[k][j] : to_f32(gp.v[j]);
        const float xhat = fmaf(kHold ? hd[k][j] : to_f32(xp.v[j]) - c, rstd, nshift);
        out.v[j] = from_f32<T>(fmaf(rstd, gy * wf[k][j], fmaf(xhat, nb, ne)));
        if constexpr (!kColumns) {
          dw[k][j] = fmaf(gy, xhat, dw[k][j]);
          db[k][j] += gy;
        }
      }
      store_pack(dx + i * N, out);
    }
    if (++s == stages) s = 0, parity ^= 1u;
  }

  if constexpr (kColumns) {
    grid_barrier(barrier, gridDim.x);
    ln_dw_db_by_columns(a, partial, slice, dw_out, dw_stride, db_out, db_stride);
  } else {
    float* part = partial + int64_t(blockIdx.x) * 2 * a.hidden;
    norm::store_partial_row<T, K>(part, a.hidden, dw);
    norm::store_partial_row<T, K>(part + a.hidden, a.hidden, db);
    grid_barrier(barrier, gridDim.x);
    // dw and db together: the 2 * hidden columns of the G partial rows.
    norm::reduce_partials(partial, gridDim.x, 2 * a.hidden, slice, [&](int64_t col, float total) {
      if (col < a.hidden) dw_out[col * dw_stride] = from_f32<T>(total);
      else db_out[(col - a.hidden) * db_stride] = from_f32<T>(total);
    });
  }
}

template <class T, int K, bool kHold>
bool launch_k(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw, const TensorView& db,
              int block) {
  const CudaDeviceProps& props = cuda_device_props(ctx.device.index);
  // Two blocks an SM at one pack a thread (64 registers), one at two.
  auto plan_for = [&](auto kernel, BulkCache& cache, BulkPlan& plan) {
    return plan_bulk(kernel, cache, props, 2 * a.hidden * int64_t(sizeof(T)), K == 1 ? 2 : 1, block, plan);
  };
  static BulkCache rows_cache, columns_cache;
  auto rows_kernel = layer_norm_bwd_bulk_kernel<T, K, false, kHold>;
  auto columns_kernel = layer_norm_bwd_bulk_kernel<T, K, true, kHold>;
  BulkPlan plan;
  if (!plan_for(rows_kernel, rows_cache, plan)) return false;
  norm::OneLaunchGrid g = norm::one_launch_grid(a.rows, 2 * a.hidden, plan.resident, block);
  // Note [column dw] reads x and dy again, against partial rows of dw and db.
  const int64_t reread = 2 * a.rows * a.hidden * int64_t(sizeof(T));
  const int64_t partials = 2 * g.blocks * 2 * a.hidden * int64_t(sizeof(float));
  BulkPlan columns_plan;
  const bool columns =
      norm::column_dw_pays(props, a.rows, reread, partials) && plan_for(columns_kernel, columns_cache, columns_plan);
  if (columns) {
    plan = columns_plan;
    g = norm::one_launch_grid(a.rows, 2 * a.hidden, plan.resident, block);
  }
  const int64_t floats = columns ? a.rows * kRowStats : g.blocks * 2 * a.hidden;  // statistics, or partials
  auto* partial = static_cast<float*>(cuda_workspace(ctx, floats * int64_t(sizeof(float))));
  unsigned* barrier = cuda_grid_barrier(ctx);
  launch_cooperative(ctx, "layer_norm_backward_cuda_vec16_async bulk-copy launch", columns ? columns_kernel : rows_kernel,
                     g.blocks, block, size_t(plan.smem), a, partial, g.rows_per_block, norm::bulk_rows_strided(),
                     plan.stages, barrier, dw.ptr<T>(), int64_t(dw.stride(0)), db.ptr<T>(), int64_t(db.stride(0)));
  return true;
}

}  // namespace

template <class T>
bool launch_bwd_rows(const Context& ctx, const BwdArgs<T>& a, const TensorView& dw, const TensorView& db) {
  static const bool off = env_off("OPFORGE_CUDA_LN_ROWS_BULK");
  const int64_t sms = cuda_device_props(ctx.device.index).sm_count;
  if (off || a.rows < norm::bulk_min_rows_per_sm(kMinRowsPerSm) * sms) return false;
  if (std::is_same_v<T, float> && a.rows >= kF32RingRowsPerSm * sms) return false;
  const int64_t n_packs = a.hidden / Pack<T>::n;
  if (n_packs > 2 * kBwdMaxThreads) return false;
  const norm::RowShape shape = norm::register_row_shape(n_packs, kBwdMaxThreads, 0);
  if (shape.k == 1) {
    if constexpr (sizeof(T) == 2) {  // Note [held row] (ops/norm/cuda_backward.cuh)
      if (norm::hold_row<T>()) return launch_k<T, 1, true>(ctx, a, dw, db, shape.block);
    }
    return launch_k<T, 1, false>(ctx, a, dw, db, shape.block);
  }
  return launch_k<T, 2, false>(ctx, a, dw, db, shape.block);
}

template bool launch_bwd_rows<float>(const Context&, const BwdArgs<float>&, const TensorView&, const TensorView&);
template bool launch_bwd_rows<__half>(const Context&, const BwdArgs<__half>&, const TensorView&, const TensorView&);
template bool launch_bwd_rows<__nv_bfloat16>(const Context&, const BwdArgs<__nv_bfloat16>&, const TensorView&,
                                             const TensorView&);

}  // namespace opforge::cuda::layernorm_fast
