// Shared helpers of the CUDA kernels: error checks, the stream and device of a call, element
// conversions, 16-byte packs and deterministic warp / block reductions.
//
// Note [cuda reductions]: every reduction here has a fixed shape for a given launch (xor butterfly
// inside a warp, then warp partials summed in warp order), so a kernel's result depends only on its
// inputs and launch shape, never on timing. A butterfly leaves the same bits in every lane because
// each step adds the same two values (float addition is commutative).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "backends/cuda/cuda_backend.h"
#include "opforge/error.h"
#include "opforge/op.h"

namespace opforge::cuda {

// ---- errors --------------------------------------------------------------------------------------
[[noreturn]] void throw_cuda_error(const char* what, cudaError_t status);

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) [[unlikely]] throw_cuda_error(what, status);
}
// OPFORGE_CUDA_CHECK(cudaMalloc(&p, n)) throws "cudaMalloc(&p, n) failed: out of memory".
#define OPFORGE_CUDA_CHECK(call) ::opforge::cuda::check((call), #call)

// After every launch: a bad configuration or an earlier asynchronous fault surfaces here.
inline void check_launch(const char* kernel) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) [[unlikely]] throw_cuda_error(kernel, status);
}

// ---- stream and device ---------------------------------------------------------------------------
// Note [current stream]: a Context whose stream handle is null means the calling thread's current
// stream: the legacy default stream unless a CurrentStreamScope on this thread names another (the
// device timer does so to capture calls into a CUDA graph). An explicit handle always wins.
cudaStream_t current_stream();
class CurrentStreamScope {
 public:
  explicit CurrentStreamScope(cudaStream_t s);
  ~CurrentStreamScope();
  CurrentStreamScope(const CurrentStreamScope&) = delete;
  CurrentStreamScope& operator=(const CurrentStreamScope&) = delete;

 private:
  cudaStream_t previous_;
};

inline cudaStream_t stream_of(const Context& ctx) {
  return ctx.stream.handle ? reinterpret_cast<cudaStream_t>(ctx.stream.handle) : current_stream();
}

// Makes ctx.device current for the scope of a launch and restores the caller's device after.
// Costs one cudaGetDevice when the device is already current (the usual case).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    OPFORGE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) OPFORGE_CUDA_CHECK(cudaSetDevice(index));
    else previous_ = -1;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);  // best effort: destructors do not throw
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// A launch on ctx's stream with `attrs` (n of them) for cudaLaunchKernelEx.
inline cudaLaunchConfig_t launch_config(const Context& ctx, dim3 grid, dim3 block, size_t smem,
                                        cudaLaunchAttribute* attrs, unsigned n) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream_of(ctx);
  config.attrs = attrs;
  config.numAttrs = n;
  return config;
}

// Launches `kernel` cooperatively (every block resident at once, as a grid barrier needs; Note
// [grid barrier]) on ctx's stream with `blocks` x `threads` and `smem` bytes of dynamic shared
// memory, with programmatic stream serialization where the device allows it (Note [programmatic
// launch]: the kernel starts with programmatic_prologue()). A refused launch (more blocks than
// fit) throws naming `what` and clears the error, so it does not surface at the next launch.
// Defined after launch_ex, below.
template <class... Params, class... Args>
void launch_cooperative(const Context& ctx, const char* what, void (*kernel)(Params...), int64_t blocks,
                        int64_t threads, size_t smem, Args&&... args);

// Note [programmatic launch]: the latency-bound kernels (the row-wise forwards, the activations,
// rotary, routing) are launched with programmatic stream serialization (PDL, compute capability
// 9.0 on): the next kernel in the stream may be scheduled before this one ends, and its blocks
// wait in programmatic_prologue() until every grid before it has completed and its writes are
// visible. Such a kernel therefore calls programmatic_prologue() before its first global memory
// access (read or write), so it sees exactly what a plain launch would; what overlaps is the
// launch itself, block scheduling and the parameter loads: 0.4-0.5 us a call on an H200, a
// quarter of a call at 16 tokens (docs/perf/gpu-h200-2026-11-27-round13.md). The prologue then
// lets the next kernel launch: its blocks take SM slots only as this kernel's blocks leave, so a
// many-wave grid is not slowed. Kernels launched without the attribute (older cards,
// OPFORGE_CUDA_PDL=0) run the two instructions as no-ops. The gain needs the kernel before to let
// it launch early: another opforge kernel of this kind, or any kernel's end. Launched this way:
// the norm forwards and backwards (with their dw reductions), layer_norm, the activations
// (forward and backward), rotary, topk_softmax, grouped_topk, quant_fp8, softmax,
// cross_entropy, kl_div / jsd / tvd, the losses' row reductions, embedding's gather, moe_permute
// (its kernels but CUB's scan), moe_unpermute, and the norm backward's few-row cluster (launch_cluster).
// Cooperative launches too (launch_cooperative: softmax's split rows, per-tensor quant, the
// one-launch norm and layer_norm backwards): their blocks still wait in the prologue until the
// grid before has completed, and the grid after is launched only once every block of theirs has
// passed its prologue, so all of them are resident, as the grid barrier needs; H200, bf16,
// 1,024 x 4,096, same call: rms_norm_backward 13.77 / 13.86 -> 13.44 us, fused_add_rms_norm_
// backward 18.11 / 17.33 -> 16.79 (docs/perf/gpu-h200-2026-11-29-round26.md).
// Not: cross_entropy_with_grad's clusters, cross_entropy's split-row forward (measured slower
// so: 9.9 -> 10.5 us at 16 x 128,256), cuBLASLt GEMMs, attention, and the kernels around CUB's
// sort.
__device__ __forceinline__ void programmatic_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches on this device carry the attribute: compute capability >= 9 and the
// environment does not set OPFORGE_CUDA_PDL=0 (read once; for side-by-side timing).
bool programmatic_launch_enabled(int device_index);

// Launches `kernel`, whose first statement is programmatic_prologue(), on ctx's stream with
// Note [programmatic launch]; checks the launch like check_launch(what).
// cudaLaunchKernelEx with `config`. When `programmatic`, its last attribute is the programmatic
// one, and a stream that refuses it gets the launch without it. A refused launch throws naming
// `what` (the error cleared, so it does not surface at the next launch); then check_launch(what).
template <class... Params, class... Args>
void launch_ex(const char* what, cudaLaunchConfig_t config, bool programmatic, void (*kernel)(Params...),
               Args&&... args) {
  cudaError_t status = cudaLaunchKernelEx(&config, kernel, args...);
  if (status != cudaSuccess && programmatic) {
    cudaGetLastError();
    --config.numAttrs;
    status = cudaLaunchKernelEx(&config, kernel, args...);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw_cuda_error(what, status);
  }
  check_launch(what);
}

template <class... Params, class... Args>
void launch_cooperative(const Context& ctx, const char* what, void (*kernel)(Params...), int64_t blocks,
                        int64_t threads, size_t smem, Args&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  const bool programmatic = programmatic_launch_enabled(ctx.device.index);
  launch_ex(what, launch_config(ctx, dim3(unsigned(blocks)), dim3(unsigned(threads)), smem, attr, programmatic ? 2 : 1),
            programmatic, kernel, std::forward<Args>(args)...);
}

template <class... Params, class... Args>
void launch_programmatic(const Context& ctx, const char* what, void (*kernel)(Params...), dim3 grid,
                         dim3 block, size_t smem, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  const bool programmatic = programmatic_launch_enabled(ctx.device.index);
  launch_ex(what, launch_config(ctx, grid, block, smem, attr, programmatic ? 1 : 0), programmatic, kernel, args...);
}

// Note [cluster launch] (compute capability 9.0 on): the CTAs of a thread-block cluster are
// scheduled together on one GPC and read each other's shared memory (distributed shared memory),
// so a row cut over a cluster's CTAs merges its partial reductions with a cluster barrier
// (hundreds of nanoseconds) instead of a grid barrier through global memory, and the clusters of
// a launch never wait for each other: no residency requirement, unlike a cooperative launch.
// launch_cluster launches `kernel` in clusters of `cluster` CTAs along x (grid.x a multiple of
// it), with programmatic stream serialization added when the device allows it (Note
// [programmatic launch]; the kernel then starts with programmatic_prologue()).
// cluster_max_active is how many such clusters the device holds at once
// (cudaOccupancyMaxActiveClusters, asked once per device, kernel and shape; 0 before compute
// capability 9.0 or when it refuses); cluster_launch_fits says whether it holds one at all: a
// small MIG slice may not, and the caller then takes another path.
// The few-row cluster kernels (the norm backward's, the softmax family's) also need cluster_rows_enabled(): false
// when the environment sets OPFORGE_CUDA_CLUSTER_ROWS=0 (read once), for side-by-side timing
// against the paths they replace.
int cluster_max_active(int device_index, const void* kernel, int cluster, int threads, size_t smem);
// The most dynamic shared memory a block of `kernel` may take on the device (the opt-in limit
// less the kernel's static shared memory), with the kernel's limit raised to it; the ring kernels
// (Note [row ring]) ask once (static).
int64_t dynamic_smem_room(const void* kernel, const CudaDeviceProps& props);
bool cluster_launch_fits(int device_index, const void* kernel, int cluster, int threads, size_t smem);
bool cluster_rows_enabled();
// Note [many-row cluster] (ops/softmax/cluster_plan.h) also needs many_row_clusters_enabled():
// false when the environment sets OPFORGE_CUDA_MANY_ROW_CLUSTERS=0 (read once).
bool many_row_clusters_enabled();

template <class... Params, class... Args>
void launch_cluster(const Context& ctx, const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
                    size_t smem, int cluster, Args&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  const bool programmatic = programmatic_launch_enabled(ctx.device.index);
  launch_ex(what, launch_config(ctx, grid, block, smem, attr, programmatic ? 2 : 1), programmatic, kernel, args...);
}

// The two halves of a cluster barrier: arrive once this CTA has read the others' shared memory,
// wait before leaving (a CTA's shared memory must outlive the other CTAs' reads of it). Work
// between the two (a CTA's stores) overlaps the other CTAs' arrival. The arrive is relaxed: it
// publishes nothing (cluster.sync() does that where partials are exchanged), it only says that
// the remote reads are done, and they are: their values are used (stored into this CTA's shared
// memory) before it, so the loads have returned. A release arrive waits for every earlier memory
// access of the thread, its global stores too (the norm clusters' largest stall after barriers).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// Asynchronous 16-byte copies global -> shared (cp.async, LDGSTS; compute capability 8.0 on),
// bypassing L1 and registers. A thread's copies form commit groups; cp_async_wait<n> waits until
// at most n of its newest groups are in flight (cp_async_wait_all: none). The memory clobbers keep
// the shared-memory reads after the wait. A thread that reads back only what it copied itself
// needs no barrier (Note [async row pipeline] in ops/layernorm/cuda_fast.cu).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* global_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int pending> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Note [bulk copies]: 1-D bulk copies global -> shared by the copy engine (cp.async.bulk, compute
// capability 9.0 on) that complete on an mbarrier in shared memory. One thread initialises the
// barrier (bulk_barrier_init, arrival count 1, then a barrier of the block before anyone waits),
// announces the bytes of a round and issues its copies (bulk_expect, bulk_copy: source and
// destination 16-byte aligned, size a multiple of 16); the round's phase completes when the last
// byte lands, and every reader waits for it with the parity of that round (bulk_wait: round n has
// parity n & 1). A buffer may be refilled once every thread that read it has passed a block
// barrier after its reads.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bulk_barrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // seen by the copy engine
}
__device__ __forceinline__ void bulk_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy(void* smem_dst, const void* global_src, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem_dst)),
               "l"(global_src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void bulk_wait(uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.b32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Note [row ring]: resident blocks walking rows keep a ring of `stages` shared-memory buffers,
// each with its mbarrier (full[s]): thread 0 initialises the barriers and fills the first stages
// (ring_fill: one bulk copy of a row's bytes, Note [bulk copies]); a block barrier follows before
// anyone waits. For each row, every thread waits on its stage with the cursor's parity, and once
// every thread's reads of the stage are behind a block barrier thread 0 refills it with the row
// `stages` rows ahead; ring_advance moves the cursor (the parity flips each time the ring wraps).
// Used by Note [softmax row pipeline] and Note [cross_entropy row pipeline].
struct RingCursor {
  int stage = 0;
  unsigned parity = 0;
};
__device__ __forceinline__ void ring_fill(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  bulk_expect(bar, bytes);
  bulk_copy(dst, src, bytes, bar);
}
__device__ __forceinline__ void ring_advance(RingCursor& c, int stages) {
  if (++c.stage == stages) c.stage = 0, c.parity ^= 1u;
}

// Grid size for `work` items of `per_block` each, capped at the grid's x limit (kernels loop).
inline unsigned grid_for(int64_t work, int64_t per_block) {
  int64_t blocks = (work + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  return unsigned(blocks < 0x7fffffff ? blocks : 0x7fffffff);
}

// ---- elements ------------------------------------------------------------------------------------
// f32 <-> element with round to nearest even (Note [rounding] in dtype.h).
template <class T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <class T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Note [element exp]: exp of an element in the precision its type needs. f32 data gets the
// accurate expf (a ~20-instruction polynomial; the f32 results must match the reference to a few
// ulps). bf16 / f16 data gets exp2_ftz(x log2(e)): ex2.approx.ftz on the special-function unit,
// relative error below ~2^-22 + 1e-7 |x|, far under the 2^-8 / 2^-11 spacing the result is
// rounded to, which keeps these memory-bound kernels from becoming bound by the exp instead.
// The ftz form matters: __expf (ex2.approx without .ftz) compiles to a range test and two
// multiplies around the MUFU.EX2 that keep results below 2^-126 subnormal, four instructions
// more an exp (the bf16 softmax cluster kernel with 64 values a thread: 1,912 -> 1,408 SASS
// instructions with .ftz and the shift folded into one FFMA). What .ftz changes: an exp below
// 2^-126 (x < -87.3) is 0 instead of a subnormal; every output is a sum of such terms with at
// least one 1 in it (softmax, cross_entropy: the max's own term), or that tiny value itself,
// 1e-38 from the reference, inside any tolerance.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;
// log2 on the special-function unit, lg2.approx.ftz: a subnormal argument reads as 0 (-inf out),
// so callers pass normal numbers only (Note [element log] in ops/loss/cuda_divergence.cu). __logf
// is lg2.approx without .ftz, which adds a range test and a rescale around the MUFU.LG2.
__device__ __forceinline__ float log2_ftz(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLn2 = 0.6931471805599453f;
// 1 / x on the special-function unit, rcp.approx.ftz (relative error near 2^-23): one MUFU.RCP, as
// __fdividef(1, x) compiles to, said outright. A subnormal result (|x| > 2^126) is 0.
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Sixteen bytes of elements: one LDG.128 / STG.128. The pointer must be 16-byte aligned (each
// vectorized kernel's predicate checks it).
template <class T> struct alignas(16) Pack {
  static constexpr int n = 16 / int(sizeof(T));
  T v[n];
};
template <class T> __device__ __forceinline__ Pack<T> load_pack(const T* p) {
  uint4 raw = *reinterpret_cast<const uint4*>(p);
  Pack<T> out;
  static_assert(sizeof(out) == sizeof(raw));
  __builtin_memcpy(&out, &raw, sizeof(raw));
  return out;
}
template <class T> __device__ __forceinline__ Pack<T> load_pack_readonly(const T* p) {
  uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  Pack<T> out;
  __builtin_memcpy(&out, &raw, sizeof(raw));
  return out;
}
template <class T> __device__ __forceinline__ void store_pack(T* p, const Pack<T>& pack) {
  uint4 raw;
  __builtin_memcpy(&raw, &pack, sizeof(raw));
  *reinterpret_cast<uint4*>(p) = raw;
}
// Note [streaming stores]: st.global.cs ("cache streaming": the line is the L2's first to evict)
// for an output that nothing in the kernel reads again and that is far larger than the L2, so
// the written lines do not push out lines the kernel's loads are still to use. Measured on an
// H200 (docs/perf/gpu-h200-2026-11-29-round24.md): cross_entropy_with_grad 8,192 x 128,256 bf16
// 1,365 -> 1,297 us with the gradient stored this way (an evict-first hint on its loads was
// slower, 1,383 us); fused_add_rms_norm_backward's bulk pipeline 16,384 x 4,096 bf16 217 -> 214 us
// with dx and dresidual so; layer_norm_backward's pipeline measured the same either way (kept
// plain).
template <class T> __device__ __forceinline__ void store_pack_streaming(T* p, const Pack<T>& pack) {
  uint4 raw;
  __builtin_memcpy(&raw, &pack, sizeof(raw));
  __stcs(reinterpret_cast<uint4*>(p), raw);
}

// A pack's elements in f32. bf16 is the top half of an f32: each 32-bit word widens with a shift
// and a mask, so a pack held in registers stays four registers (converting element by element
// lets the compiler split it into 16-bit halves and spill register-cached rows).
template <class T> struct PackFloats {
  float v[Pack<T>::n];
};
template <class T> __device__ __forceinline__ PackFloats<T> widen_pack(const Pack<T>& p) {
  PackFloats<T> f;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    uint32_t w[4];
    __builtin_memcpy(w, &p, sizeof(w));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f.v[2 * i] = __uint_as_float(w[i] << 16);
      f.v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < Pack<T>::n; ++j) f.v[j] = to_f32(p.v[j]);
  }
  return f;
}
// Rounds f32 values to a pack (nearest even); bf16 pairs go through one 32-bit conversion each, so
// the pack stays four registers (the counterpart of widen_pack).
template <class T> __device__ __forceinline__ Pack<T> narrow_pack(const PackFloats<T>& f) {
  Pack<T> p;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(f.v[2 * i], f.v[2 * i + 1]);
      __builtin_memcpy(&w[i], &h, sizeof(h));
    }
    __builtin_memcpy(&p, w, sizeof(w));
  } else {
#pragma unroll
    for (int j = 0; j < Pack<T>::n; ++j) p.v[j] = from_f32<T>(f.v[j]);
  }
  return p;
}

// Whether the environment variable `name` is set to "0" (a switch that turns a default path off,
// for side-by-side timing). Read by the caller once (static).
inline bool env_off(const char* name) {
  const char* e = std::getenv(name);
  return e && e[0] == '0' && e[1] == '\0';
}

// Tuning override for a launch constant: the environment variable `name` rounded down to a power of
// two in [lo, hi]; 0 (use the default) when unset or below lo. Read once by the caller (static).
inline int env_choice(const char* name, int lo, int hi) {
  const char* e = std::getenv(name);
  if (!e) return 0;
  const long long n = std::atoll(e);
  long long v = lo;  // 64-bit: doubling toward a large hi must not overflow
  while (v * 2 <= n && v * 2 <= hi) v *= 2;
  return n >= lo ? int(v) : 0;
}

// ---- reductions (Note [cuda reductions]) ----------------------------------------------------------
// Sum over aligned groups of `width` lanes (a power of two <= 32); every lane of a group gets it.
template <int width = 32> __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
// Sum over aligned groups of `width` lanes chosen at run time (a power of two <= 32).
__device__ __forceinline__ float lane_group_sum(float v, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float2 warp_sum2(float2 v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
  }
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the same
// bits. `scratch` holds 32 floats of shared memory; the trailing barrier lets the caller reuse it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = group_sum<32>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : 0.0f;
  v = group_sum<32>(v);
  __syncthreads();
  return v;
}
__device__ __forceinline__ float2 block_sum2(float2 v, float2* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum2(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : make_float2(0.0f, 0.0f);
  v = warp_sum2(v);
  __syncthreads();
  return v;
}

// Max over the whole block (blockDim.x * blockDim.y threads, a multiple of 32, at most 1024);
// every thread gets it. `scratch` holds 32 floats; the trailing barrier lets the caller reuse it.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  const int lane = t & 31, warp = t >> 5, n_warps = (blockDim.x * blockDim.y) >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : -INFINITY;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  return v;
}

// Sums N values at once over the whole block (blockDim.x a multiple of 32, at most 1024): one
// butterfly per value, one barrier pair for all N. `scratch` holds N * 32 floats of shared memory.
// Same fixed order as block_sum, so every thread gets the same bits.
template <int N> __device__ __forceinline__ void block_sum_n(float (&v)[N], float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = group_sum<32>(v[i]);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < N; ++i) scratch[i * 32 + warp] = v[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = group_sum<32>(lane < n_warps ? scratch[i * 32 + lane] : 0.0f);
  __syncthreads();
}

// Note [reduce-scatter block sum]: N sums (N = 1, 2, 4 or 8) over the block with one barrier and
// about a third of block_sum_n's shuffles, for kernels that reduce once a row and do little else
// a row (the norm backwards' row pipelines, where the reduction was a third of the instructions).
// Inside a warp, the first log2 N butterfly steps trade half of the values: at offset o a lane
// with bit o set keeps the upper half and sends the lower, its partner the other way round, so
// each step halves the values a lane holds (N = 4: 2 + 1 + 3 shuffles against 20). Lane l then
// holds sum q = l / (32 / N) of the warp, the same bits across its group of 32 / N lanes. The
// warps' partials go through shared memory, each group of lanes adds value q's partials of every
// warp (a lane a few, then a butterfly over the group) and every lane takes the N totals from the
// groups' first lanes: fixed order, the same bits in every thread. `scratch` holds 2 * N * 32
// floats used in turns (`turn` flips each call), so no trailing barrier is needed: the one barrier
// of the next call separates this call's reads from the writes of the call after it. Every thread
// of the block calls it, the same number of times.
template <int N> __device__ __forceinline__ float warp_reduce_scatter(float (&v)[N], int lane) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "warp_reduce_scatter: N is 1, 2, 4 or 8");
  int offset = 16;
#pragma unroll
  for (int m = N; m > 1; m /= 2, offset /= 2) {
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < m / 2; ++i) {
      const float send = upper ? v[i] : v[i + m / 2];
      const float keep = upper ? v[i + m / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
  }
  float r = v[0];
#pragma unroll
  for (; offset > 0; offset /= 2) r += __shfl_xor_sync(0xffffffffu, r, offset);
  return r;
}
template <int N> __device__ __forceinline__ void block_sum_once(float (&v)[N], float* scratch, unsigned& turn) {
  constexpr int G = 32 / N;  // lanes a value
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  float* buf = scratch + (turn & 1u) * (N * 32);
  ++turn;
  const int q = lane / G;
  const float r = warp_reduce_scatter<N>(v, lane);
  if (lane % G == 0) buf[q * 32 + warp] = r;
  __syncthreads();
  float t = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) {  // n_warps <= 32 = N * G
    const int w = lane % G + k * G;
    if (w < n_warps) t += buf[q * 32 + w];
  }
  t = group_sum<G>(t);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = __shfl_sync(0xffffffffu, t, i * G);
}

// Note [row rsqrt]: 1 / sqrt(v) for a row's scale (layer_norm's rstd), computed by every thread of
// the row once a row. `1.0f / sqrtf(v)` compiles to sqrt.rn and rcp.rn, each an estimate, its
// refinement and a slow-path test (with the division by the hidden size, some 40 instructions: a
// tenth of what a thread of layer_norm_backward's pipeline issues a row). Here the hardware
// estimate (rsqrt.approx, within 2 ulp) takes one Newton step, r (3 - v r^2) / 2, which leaves it
// within about 1 ulp of the correctly rounded value: 5 instructions. v = 0, inf and NaN keep the
// estimate (inf, 0, NaN: the exact answers, which the Newton step would turn into NaN).
// On an H200 (docs/perf/gpu-h200-2026-11-29-round22.md, same call): layer_norm_backward bf16
// 16,384 x 4,096 126.6 -> 116.5 us (76% -> 83% of copy), f16 120.3 -> 113.8 us, layer_norm at
// 1,024 tokens 5.25 -> 5.14 us. f32 keeps the correctly rounded form (rstd_of<float>,
// ops/layernorm/cuda_backward.cuh): with the estimate, layer_norm_backward's f32 dw over 2,400
// rows of mean 100 missed its 1e-4 tolerance (4.6e-4), and the f32 kernels are bound by memory,
// not by these instructions. The rms_norm family keeps 1.0f / sqrtf too: its bulk-copy pipeline
// measured 6% slower with the estimate (116 against 110 us at 16,384 x 4,096, two repetitions),
// for a reason not found.
__device__ __forceinline__ float row_rsqrt(float v) {
  const float r = rsqrtf(v);
  const float refined = r * fmaf(-0.5f * v * r, r, 1.5f);
  return (v > 0.0f && v <= 3.402823466e38f) ? refined : r;
}

// Note [grid barrier]: every block of a cooperative launch (cudaLaunchAttributeCooperative, so all
// blocks are resident) waits here until all have arrived; writes before it are visible to every
// block after it (read them with __ldcg: L1 is not coherent). `state` is cuda_grid_barrier(ctx).
// One atomic per block: block 0 adds 2^31 - (blocks - 1) and every other block 1, so the top bit
// of the word flips once all have arrived and the low bits come back to where they were (the
// word needs no reset, whatever the grid size of the next launch).
// Memory order: the block barrier orders every thread's writes before thread 0's arrival, an
// atomic add with release semantics at device scope (release is cumulative over what the barrier
// ordered before it, so one thread publishes the whole block's writes); thread 0 then spins on an
// acquire load of the word, and the closing block barrier passes what it acquired on to the
// block's other threads (the pattern of CUTLASS's generic barrier). A fence in every thread, as
// these functions first had, cost several microseconds a launch (Note [last block]); a full
// __threadfence (fence.sc) before and after thread 0's plain atomic is stronger than the barrier
// needs and sat on the critical path of every few-row kernel that ends in one.
__device__ __forceinline__ unsigned atomic_add_release(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned atomic_add_acq_rel(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void grid_barrier(unsigned* state, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (blocks - 1) : 1u;
    const unsigned before = atomic_add_release(state, add);  // the block's writes, then its arrival
    while (((before ^ load_acquire(state)) & 0x80000000u) == 0) __nanosleep(20);
  }
  __syncthreads();
}

// Note [last block]: the same word and arithmetic as grid_barrier, without waiting: true in the one
// block whose arrival completes the launch (its add flips the top bit), false in the others, so a
// grid's last block can finish the work of all (a combine, a reduction) in the same launch. The
// launch need not be cooperative. Writes every block made before arriving are visible to the last
// one (read them with __ldcg). Leaves the word's low bits as they were, like the barrier. Thread
// 0's arrival is one acquire-release atomic after the block barrier: release for this block's
// writes, acquire for every earlier block's (the last one reads them all).
// arrival_add: this block's addend of the word; arrival_completes: whether the add that found
// `before` there flipped the top bit (this block arrived last).
__device__ __forceinline__ unsigned arrival_add(unsigned blocks) {
  return blockIdx.x == 0 ? 0x80000000u - (blocks - 1) : 1u;
}
__device__ __forceinline__ bool arrival_completes(unsigned before, unsigned add) {
  return ((before ^ (before + add)) & 0x80000000u) != 0;
}
__device__ __forceinline__ bool last_block_arrives(unsigned* state, unsigned blocks) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned add = arrival_add(blocks);
    last = arrival_completes(atomic_add_acq_rel(state, add), add);
  }
  __syncthreads();
  return last;
}

// ---- dtype dispatch ------------------------------------------------------------------------------
// Calls f(T{}) with T = float, __half or __nv_bfloat16 for the view's dtype; throws otherwise
// (predicates reject other dtypes first, so this is a broken invariant).
template <class F> void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::f16: f(__half{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    default:
      throw Error(ErrorCode::internal,
                  std::string(op) + ": CUDA kernel called with dtype " + dtype_name(dtype));
  }
}

// ---- predicate helpers (static reasons, no allocation) ------------------------------------------
inline bool is_cuda_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }
inline constexpr const char* kNotCudaFloat = "dtype is not f32, f16 or bf16";
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// nullptr when the rows of `t` (Note [row layout]) can be read as 16-byte packs with `elements`
// per row: a 16-byte aligned base, a row length and a row stride that are multiples of the pack.
inline const char* pack_rows_problem(const TensorView& t, int64_t elements) {
  const int64_t n = 16 / t.itemsize();
  if (!aligned16(t.data)) return "a data pointer is not 16-byte aligned";
  if (elements % n != 0) return n == 8 ? "row length % 8 != 0" : "row length % 4 != 0";
  if (t.rows() > 1 && t.row_stride() % n != 0)
    return n == 8 ? "row stride % 8 != 0" : "row stride % 4 != 0";
  return nullptr;
}

}  // namespace opforge::cuda
