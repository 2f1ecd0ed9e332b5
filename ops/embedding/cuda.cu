// CUDA kernels of the embedding family: embedding (a row gather) and its deterministic backward.
//
// Ids on a CUDA device are not range-checked by Embedding::check (reading them would synchronize
// with the host); the kernels never read or write out of bounds for them: the forward writes a row
// of zeros for an id outside [0, vocab), the backward skips such tokens.
//
// Forward technique. A pure copy: ids read once, one row of w and of y per token, no flops.
//  - cuda_vec16 (priority 200): 16-byte packs (LDG.128 / STG.128) of each row, for 16-byte aligned
//    bases with dim and both row strides multiples of the pack (8 bf16/f16, 4 f32); the predicate
//    names what fails. dim 4096 bf16 is 512 packs: 256 threads take two per row.
//  - cuda (priority 100): the same walk over single elements (any layout the check accepts: odd
//    dims, padded rows) — the scalar tail of every layout the vec16 kernel refuses.
//  Launch shape: 2-D blocks of 256 threads, x over column units of a row (a power of two up to 256),
//  y over tokens, so short rows share a block; grid y capped at 65535 with a token stride loop.
//  int64 offsets (id * w_stride, token * y_stride). One launch on the Context's stream, no host
//  synchronization, no allocation.
//
// Backward technique (deterministic: dw[v] sums dy rows in increasing token order, in f32):
//   1. keys[i] = ids[i] (vocab for an id out of range), vals[i] = i;
//   2. cub::DeviceRadixSort::SortPairs over the key bits needed for vocab: a stable LSD radix
//      sort, so equal ids keep increasing token order, and its result does not depend on timing;
//   3. first[v] / end[v]: where the run of key v starts and ends among the sorted positions (-1:
//      no token has id v; first[] set by one memset, then one kernel over the sorted keys);
//   4. Note [embedding backward rows]: one kernel writes every row of dw exactly once, the forward's
//      2-D launch shape over (vocab rows, column units): a row without tokens (or padding_idx) gets
//      zeros, any other the f32 sum of its run's dy rows in sorted order. The ideal traffic is one
//      write of dw and one read of the dy rows; zeroing dw first and then rewriting the rows with
//      tokens, one 2-byte store at a time, took 231 us for a 32,000 x 4,096 bf16 table on an H200
//      (27% of the copy bandwidth) even for one token; now 77-103 us (two machines,
//      docs/perf/gpu-h200-2026-11-30-round28.md).
//   16-byte packs when the vec16 predicate holds, else single elements. Out-of-range ids are
//   skipped (their key, vocab, is no row). Scratch (keys, values, tables, CUB's temporary storage)
//   is the backend's per-stream workspace (Note [cuda workspace]): allocated on the first call of a
//   size, reused after; no host sync.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/embedding/embedding_cuda.h"

namespace opforge {
namespace cuda::embedding {
namespace {

int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

template <class I> __device__ __forceinline__ int64_t id_of(const I* ids, int64_t i) { return int64_t(ids[i]); }

// ---- forward -------------------------------------------------------------------------------------
template <class T, class I> struct FwdArgs {
  T* y;
  const T* w;
  const I* ids;
  int64_t y_stride, w_stride, tokens, dim, vocab;
};

template <class T, class I, bool kVec> __global__ void __launch_bounds__(256) gather_kernel(FwdArgs<T, I> p) {
  programmatic_prologue();  // Note [programmatic launch]
  constexpr int64_t width = kVec ? Pack<T>::n : 1;
  const int64_t units = p.dim / width;
  const int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;
  const int64_t step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t t = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; t < p.tokens; t += step) {
    const int64_t id = id_of(p.ids, t);
    const bool ok = id >= 0 && id < p.vocab;
    T* dst = p.y + t * p.y_stride + u * width;
    const T* src = p.w + (ok ? id : 0) * p.w_stride + u * width;
    if constexpr (kVec) {
      if (ok) {
        store_pack(dst, load_pack_readonly(src));
      } else {
        Pack<T> z;
#pragma unroll
        for (int j = 0; j < Pack<T>::n; ++j) z.v[j] = from_f32<T>(0.0f);
        store_pack(dst, z);
      }
    } else {
      *dst = ok ? *src : from_f32<T>(0.0f);
    }
  }
}

template <bool kVec>
void run_forward(const Context& ctx, const TensorView& y, const TensorView& ids, const TensorView& w) {
  const int64_t tokens = ids.numel(), dim = w.size(1);
  if (tokens == 0 || dim == 0) return;
  DeviceGuard guard(ctx.device.index);
  dispatch_float(w.dtype, "embedding", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto id_tag) {
      using I = decltype(id_tag);
      FwdArgs<T, I> p{y.ptr<T>(), w.ptr<T>(), static_cast<const I*>(ids.data), row_stride_of(y),
                      row_stride_of(w), tokens, dim, w.size(0)};
      const int64_t units = dim / (kVec ? Pack<T>::n : 1);
      int bx = 1;
      while (bx < units && bx < 256) bx *= 2;
      const int by = 256 / bx;
      const dim3 grid(unsigned((units + bx - 1) / bx), unsigned(std::min<int64_t>((tokens + by - 1) / by, 65535)));
      launch_programmatic(ctx, "embedding kernel launch", gather_kernel<T, I, kVec>, grid, dim3(bx, by), 0, p);
    };
    if (ids.dtype == DType::i32) launch(int32_t{});
    else launch(int64_t{});
  });
}

// ---- backward ------------------------------------------------------------------------------------
template <class I>
__global__ void keys_kernel(const I* ids, int64_t tokens, int64_t vocab, int32_t* keys, int32_t* vals) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = int64_t(ids[i]);
    keys[i] = int32_t(id >= 0 && id < vocab ? id : vocab);
    vals[i] = int32_t(i);
  }
}

// Marks the runs of equal sorted keys: first[key] = the run's first position, end[key] = one past
// its last (first[] holds -1 beforehand, so a row without tokens reads -1).
__global__ void runs_kernel(const int32_t* keys, int64_t tokens, int32_t* first, int32_t* end) {
  for (int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; s < tokens; s += int64_t(gridDim.x) * blockDim.x) {
    const int32_t key = keys[s];
    if (s == 0 || keys[s - 1] != key) first[key] = int32_t(s);
    if (s + 1 == tokens || keys[s + 1] != key) end[key] = int32_t(s + 1);
  }
}

template <class T> struct BwdArgs {
  T* dw;
  const T* dy;
  const int32_t* vals;   // token of each sorted position
  const int32_t* first;  // per vocab row: its run's first sorted position, or -1
  const int32_t* end;    // per vocab row with a run: one past its last position
  int64_t dw_stride, dy_stride, dim, vocab, padding_idx;
};

// Every row of dw written once (Note [embedding backward rows]): 2-D blocks as the forward's, x
// over column units, y over vocab rows.
template <class T, bool kVec> __global__ void __launch_bounds__(256) rows_kernel(BwdArgs<T> p) {
  constexpr int N = kVec ? Pack<T>::n : 1;
  const int64_t units = p.dim / N;
  const int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= units) return;
  const int64_t step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t v = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; v < p.vocab; v += step) {
    const int32_t s = v == p.padding_idx ? -1 : p.first[v];
    float acc[N] = {};
    if (s >= 0) {
      const int32_t e = p.end[v];
      for (int32_t i = s; i < e; ++i) {
        const T* src = p.dy + int64_t(p.vals[i]) * p.dy_stride + u * N;
        if constexpr (kVec) {
          const Pack<T> x = load_pack(src);
#pragma unroll
          for (int j = 0; j < N; ++j) acc[j] += to_f32(x.v[j]);
        } else {
          acc[0] += to_f32(*src);
        }
      }
    }
    T* dst = p.dw + v * p.dw_stride + u * N;
    if constexpr (kVec) {
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < N; ++j) out.v[j] = from_f32<T>(acc[j]);
      store_pack(dst, out);
    } else {
      *dst = from_f32<T>(acc[0]);
    }
  }
}

int end_bit_for(int64_t vocab) {  // keys are in [0, vocab]
  int bits = 1;
  while (bits < 31 && (int64_t(1) << bits) <= vocab) ++bits;
  return bits;
}

int64_t align_up(int64_t n) { return (n + 255) / 256 * 256; }

template <bool kVec>
void run_backward(const Context& ctx, const TensorView& dw, const TensorView& dy, const TensorView& ids,
                  const TensorView& w, int64_t padding_idx) {
  const int64_t tokens = ids.numel(), vocab = w.size(0), dim = w.size(1);
  if (vocab == 0 || dim == 0) return;
  DeviceGuard guard(ctx.device.index);
  const cudaStream_t stream = stream_of(ctx);
  const unsigned sms = unsigned(cuda_device_props(ctx.device.index).sm_count);
  dispatch_float(w.dtype, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    T* dw_p = dw.ptr<T>();
    const int64_t dw_stride = row_stride_of(dw);
    // Scratch: keys, values, sorted keys, sorted values, first and end positions of each row's
    // run (vocab + 1 entries: out-of-range ids have key vocab), CUB's temporary storage.
    size_t cub_bytes = 0;
    if (tokens > 0)
      OPFORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const int32_t*>(nullptr),
                                                         static_cast<int32_t*>(nullptr),
                                                         static_cast<const int32_t*>(nullptr),
                                                         static_cast<int32_t*>(nullptr), int(tokens), 0,
                                                         end_bit_for(vocab), stream));
    const int64_t part = align_up(std::max<int64_t>(tokens, 1) * int64_t(sizeof(int32_t)));
    const int64_t table = align_up((vocab + 1) * int64_t(sizeof(int32_t)));
    char* scratch = static_cast<char*>(cuda_workspace(ctx, 4 * part + 2 * table + int64_t(cub_bytes)));
    auto* keys = reinterpret_cast<int32_t*>(scratch);
    auto* vals = reinterpret_cast<int32_t*>(scratch + part);
    auto* sorted_keys = reinterpret_cast<int32_t*>(scratch + 2 * part);
    auto* sorted_vals = reinterpret_cast<int32_t*>(scratch + 3 * part);
    auto* first = reinterpret_cast<int32_t*>(scratch + 4 * part);
    auto* end = reinterpret_cast<int32_t*>(scratch + 4 * part + table);
    OPFORGE_CUDA_CHECK(cudaMemsetAsync(first, 0xff, size_t(vocab + 1) * sizeof(int32_t), stream));  // -1
    if (tokens > 0) {
      const unsigned key_grid = std::min(grid_for(tokens, 256), sms * 8);
      if (ids.dtype == DType::i32)
        keys_kernel<<<key_grid, 256, 0, stream>>>(static_cast<const int32_t*>(ids.data), tokens, vocab, keys, vals);
      else
        keys_kernel<<<key_grid, 256, 0, stream>>>(static_cast<const int64_t*>(ids.data), tokens, vocab, keys, vals);
      check_launch("embedding_backward keys kernel launch");
      OPFORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch + 4 * part + 2 * table, cub_bytes, keys,
                                                         sorted_keys, vals, sorted_vals, int(tokens), 0,
                                                         end_bit_for(vocab), stream));
      runs_kernel<<<key_grid, 256, 0, stream>>>(sorted_keys, tokens, first, end);
      check_launch("embedding_backward runs kernel launch");
    }
    BwdArgs<T> p{dw_p, dy.ptr<T>(), sorted_vals, first, end, dw_stride, row_stride_of(dy), dim, vocab, padding_idx};
    const int64_t units = dim / (kVec ? Pack<T>::n : 1);
    int bx = 1;
    while (bx < units && bx < 256) bx *= 2;
    const int by = 256 / bx;
    const dim3 grid(unsigned((units + bx - 1) / bx), unsigned(std::min<int64_t>((vocab + by - 1) / by, 65535)));
    rows_kernel<T, kVec><<<grid, dim3(bx, by), 0, stream>>>(p);
    check_launch("embedding_backward rows kernel launch");
  });
}

const char* vec16_problem(std::initializer_list<const TensorView*> rows, const TensorView& w) {
  if (!is_cuda_float(w.dtype)) return kNotCudaFloat;
  const int64_t dim = w.size(1);
  for (const TensorView* t : rows)
    if (const char* why = pack_rows_problem(*t, dim)) return why;
  return nullptr;
}

}  // namespace
}  // namespace cuda::embedding

using TV = TensorView;

void embedding_cuda(const Context& ctx, const TV& y, const TV& ids, const TV& w, int64_t) {
  cuda::embedding::run_forward<false>(ctx, y, ids, w);
}
const char* embedding_cuda_applicable(const TV&, const TV&, const TV& w, int64_t) {
  return cuda::is_cuda_float(w.dtype) ? nullptr : cuda::kNotCudaFloat;
}
void embedding_cuda_vec16(const Context& ctx, const TV& y, const TV& ids, const TV& w, int64_t) {
  cuda::embedding::run_forward<true>(ctx, y, ids, w);
}
const char* embedding_cuda_vec16_applicable(const TV& y, const TV&, const TV& w, int64_t) {
  return cuda::embedding::vec16_problem({&y, &w}, w);
}

void embedding_backward_cuda(const Context& ctx, const TV& dw, const TV& dy, const TV& ids, const TV& w,
                             int64_t padding_idx) {
  cuda::embedding::run_backward<false>(ctx, dw, dy, ids, w, padding_idx);
}
const char* embedding_backward_cuda_applicable(const TV&, const TV&, const TV& ids, const TV& w, int64_t) {
  if (!cuda::is_cuda_float(w.dtype)) return cuda::kNotCudaFloat;
  if (ids.numel() > 0x7fffffff || w.size(0) >= 0x7fffffff) return "more than 2^31 - 1 tokens or vocab rows";
  return nullptr;
}
void embedding_backward_cuda_vec16(const Context& ctx, const TV& dw, const TV& dy, const TV& ids,
                                   const TV& w, int64_t padding_idx) {
  cuda::embedding::run_backward<true>(ctx, dw, dy, ids, w, padding_idx);
}
const char* embedding_backward_cuda_vec16_applicable(const TV& dw, const TV& dy, const TV& ids,
                                                     const TV& w, int64_t padding_idx) {
  if (const char* why = embedding_backward_cuda_applicable(dw, dy, ids, w, padding_idx)) return why;
  return cuda::embedding::vec16_problem({&dw, &dy}, w);
}

void register_embedding_cuda(Registry& reg) {
  reg.add_kernel<Embedding>(
      cuda_kernel_desc("cuda_vec16", 200, "row gather in 16-byte packs, zeros for an out-of-range id", false),
      &embedding_cuda_vec16, &embedding_cuda_vec16_applicable);
  reg.add_kernel<Embedding>(cuda_kernel_desc("cuda", 100, "any layout: row gather, one element per step", false),
                            &embedding_cuda, &embedding_cuda_applicable);
  const char* bwd = "stable radix sort of ids (CUB), one block per id sums its dy rows in token order in f32";
  reg.add_kernel<EmbeddingBackward>(cuda_kernel_desc("cuda_vec16", 200, bwd, false),
                                    &embedding_backward_cuda_vec16, &embedding_backward_cuda_vec16_applicable);
  reg.add_kernel<EmbeddingBackward>(cuda_kernel_desc("cuda", 100, bwd, false), &embedding_backward_cuda,
                                    &embedding_backward_cuda_applicable);
}

}  // namespace opforge
