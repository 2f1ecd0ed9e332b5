// attention_prefill and attention_prefill_backward through cuDNN's fused attention (SDPA), impl
// `cudnn` of both ops (priority 400: above cuda_wmma2 / cuda_wmma / cuda, which stay registered as
// the fallback for every call this impl declines).
//
// Why it is fast: cuDNN's fused flash-attention engines for Hopper (warp-specialized TMA loads,
// wgmma tensor-core tiles, online softmax in registers; the score matrix never exists in memory).
// opforge only describes the problem as a cuDNN graph and launches the plan cuDNN picked.
//
// The graph (cuDNN frontend C++ API, header-only, built once per shape key and cached):
//  - Q, K, V, O (and dO, dQ, dK, dV) in the packed THD layout: dims [B, H, S, D] with strides
//    [-, rs, H rs, 1] (rs = the row stride of the (token, head) rows, Note [attention layout]) and a
//    ragged offset per sequence: offset_b = cu_seqlens[b] * H * rs elements.
//  - a padding mask from per-sequence lengths seq_len_b = cu_seqlens[b + 1] - cu_seqlens[b] (query
//    and key lengths are equal); causal = top-left diagonal, right bound 0; window_left = W gives a
//    left bound of W + 1 (cuDNN keeps key j for query i iff j + bound > i, i.e. j >= i - W: Note
//    [attention mask] exactly, because each sequence's query and key lengths are equal).
//  - GQA: K and V have Hkv heads, Hq a multiple of Hkv; cuDNN sums dK / dV over the group.
//  - lse: cuDNN's softmax stats (natural-log log-sum-exp of the scaled scores, f32) written
//    straight into lse [Hq, T] (dims [B, Hq, S, 1], strides [-, T, 1, 1], ragged offset
//    cu_seqlens[b]). Where the cuDNN library cannot take ragged stats (or OPFORGE_CUDNN_PADDED_STATS
//    is set), the graph is built with padded stats [B, Hq, S, 1] in the workspace and a small
//    kernel scatters (forward) or gathers (backward) them.
//  - S (the max sequence length the graph is built for) is T, the total token count: the only
//    bound known without reading cu_seqlens on the host (that read would synchronize). It is exact
//    for one sequence; with B sequences cuDNN's grid has B x ceil(T / tile) query tiles a head, of
//    which those past a sequence's end exit at once (a few microseconds of idle blocks for many
//    short sequences), padded stats take B Hq T floats, and each (B, T) pair is its own cache key.
//
// No host synchronization in the hot path: one tiny kernel derives seq_len and the ragged offsets
// (int32) from cu_seqlens on the call's stream (offsets clamped into [0, T], lengths to >= 0, so
// whatever the device holds no access leaves the tensors); cuDNN's workspace and those arrays live
// in the backend workspace (Note [cuda workspace]); the plan comes from a mutex-guarded cache.
// Tokens past cu_seqlens[B] (which the op's check rules out on the cpu) are not written.
//
// Loading: the frontend is compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, so opforge never
// links libcudnn. The first use dlopens $OPFORGE_CUDNN_LIBRARY, else libcudnn.so.9 from the
// loader's path, else the libcudnn CMake found at configure time; the frontend's own CUDA runtime
// calls need a shared libcudart of the build's major version, loaded from the loader's path, next
// to libcudnn (the pip wheels' layout) or the toolkit CMake found. Anything missing makes the impl
// unavailable with the reason (`opforge list`); nothing crashes and the other impls keep serving.
// A shape cuDNN cannot serve (graph validation or check_support fails) is declined by the
// predicate with cuDNN's message, so the call goes to the next impl.
//
// Properties: not batch-invariant (the plan depends on B and T); the backward is not
// deterministic (cuDNN accumulates dQ with atomics).
#include "ops/attention/attention_cuda.h"

#if defined(OPFORGE_WITH_CUDNN)

#include <dlfcn.h>

#include <cudnn_frontend.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_launch.cuh"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's dynamic-loading handle (set by library() below)
}

namespace opforge {
namespace cuda::attention_cudnn {
namespace {

namespace fe = cudnn_frontend;

// ---- the library ------------------------------------------------------------------------------
struct Library {
  bool ok = false;
  std::string reason;  // why not, when !ok
  size_t version = 0;  // cudnnGetVersion()
};

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// The path of the library a handle came from (dladdr of one of its symbols).
std::string path_of(void* handle, const char* symbol) {
  void* sym = dlsym(handle, symbol);
  Dl_info info{};
  if (sym && dladdr(sym, &info) && info.dli_fname) return info.dli_fname;
  return {};
}

void* try_open(const std::string& path, std::string& tried) {
  if (path.empty()) return nullptr;
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    tried += " [" + path + ": " + (why ? why : "not loadable") + "]";
  }
  return h;
}

const Library& library() {
  static const Library lib = [] {
    Library l;
    std::string tried;
    void* h = nullptr;
    const char* env = std::getenv("OPFORGE_CUDNN_LIBRARY");
    if (env && *env) h = try_open(env, tried);
    if (!h) h = try_open("libcudnn.so.9", tried);
#ifdef OPFORGE_CUDNN_LIBRARY_HINT
    if (!h) h = try_open(OPFORGE_CUDNN_LIBRARY_HINT, tried);
#endif
    if (!h) {
      l.reason = "libcudnn.so.9 could not be loaded (set OPFORGE_CUDNN_LIBRARY to its path); tried:" + tried;
      return l;
    }
    using GetVersion = size_t (*)();
    auto get_version = reinterpret_cast<GetVersion>(dlsym(h, "cudnnGetVersion"));
    if (!get_version) {
      l.reason = "the loaded cuDNN library has no cudnnGetVersion";
      return l;
    }
    l.version = get_version();
    if (l.version < 90000) {
      l.reason = "cuDNN " + std::to_string(l.version) + " is older than 9.0";
      return l;
    }
    // The frontend's CUDA runtime calls (memset of its workspace, device attributes) go through a
    // dlopen'ed libcudart.so.<major>; once a library of that soname is loaded, its dlopen finds it.
    const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    std::string tried_rt;
    void* rt = try_open(cudart, tried_rt);
    const std::string cudnn_dir = dir_of(path_of(h, "cudnnGetVersion"));
    if (!rt && !cudnn_dir.empty()) {
      for (const char* rel : {"/../../cu13/lib/", "/../../cu12/lib/", "/../../cuda_runtime/lib/", "/"})
        if ((rt = try_open(cudnn_dir + rel + cudart, tried_rt))) break;
    }
#ifdef OPFORGE_CUDART_DIR_HINT
    if (!rt) rt = try_open(std::string(OPFORGE_CUDART_DIR_HINT) + "/" + cudart, tried_rt);
#endif
    if (!rt) rt = try_open("/usr/local/cuda/lib64/" + cudart, tried_rt);
    if (!rt) {
      l.reason = "cuDNN's frontend needs a shared " + cudart + "; tried:" + tried_rt;
      return l;
    }
    // The frontend picks the first of libcudart.so.12 / .13 it can open; name the one loaded here
    // (unless the caller chose one) so it never mixes in another major.
    const std::string rt_path = path_of(rt, "cudaRuntimeGetVersion");
    if (!rt_path.empty()) setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", rt_path.c_str(), 0);
    fe::cudnn_dlhandle = h;
    l.ok = true;
    return l;
  }();
  return lib;
}

Availability availability() {
  Availability a = cuda_availability();
  if (!a.ok) return a;
  const Library& l = library();
  if (!l.ok) return {false, l.reason};
  return {};
}

// ---- handles and plans --------------------------------------------------------------------------
std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

// One cuDNN handle per device, created on first use (under cache_mutex), never destroyed.
cudnnHandle_t handle_for(int device) {
  static std::map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = fe::detail::create_handle(&h);
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(ErrorCode::backend, std::string("cudnnCreate failed: ") + fe::detail::get_error_string(st));
  handles.emplace(device, h);
  return h;
}

// Tensor uids of the graphs.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqKV, kOffQ, kOffK, kOffV, kOffO, kOffStats,
  kDO, kDQ, kDK, kDV, kOffDO, kOffDQ, kOffDK, kOffDV,
};

// The ragged-offset arrays the index kernel writes: [kNumOffsets][B + 1] int32.
enum Off : int { oQ = 0, oK, oV, oO, oStats, oDO, oDQ, oDK, oDV, kNumOffsets };

struct Problem {
  int device = 0;
  DType dtype = DType::bf16;
  int64_t batch = 0, tokens = 0, hq = 0, hkv = 0, d = 0;
  int64_t rs[kNumOffsets] = {};  // row strides (oStats: unused)
  bool causal = true;
  int64_t window_left = -1;
  float scale = 1.0f;
  bool backward = false;

  std::vector<int64_t> key(bool padded_stats) const {
    uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &scale, 4);
    std::vector<int64_t> k = {device, int64_t(dtype), batch, tokens, hq, hkv, d, causal ? 1 : 0,
                              window_left, int64_t(scale_bits), backward ? 1 : 0, padded_stats ? 1 : 0};
    k.insert(k.end(), rs, rs + kNumOffsets);
    return k;
  }
};

struct Plan {
  bool ok = false;
  std::string reason;  // cuDNN's message when !ok (stable: plans are never erased)
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  bool padded_stats = false;
};

fe::DataType_t fe_dtype(DType t) { return t == DType::f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16; }

#define OPFORGE_FE_TRY(call)                                       \
  do {                                                             \
    fe::error_t status_ = (call);                                  \
    if (status_.is_bad()) {                                        \
      plan->reason = std::string(#call) + ": " + status_.get_message(); \
      return plan;                                                 \
    }                                                              \
  } while (0)

std::shared_ptr<Plan> build_plan(const Problem& s, bool padded_stats, cudnnHandle_t handle) {
  auto plan = std::make_shared<Plan>();
  plan->padded_stats = padded_stats;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_dtype(s.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t B = s.batch, S = s.tokens, D = s.d;
  auto index = [&](int64_t uid, const char* name, int64_t n) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({n, 1, 1, 1})
                         .set_stride({1, 1, 1, 1})
                         .set_data_type(fe::DataType_t::INT32));
  };
  // A THD tensor: dims [B, H, S, D], token stride H rs, head stride rs, ragged offsets per sequence.
  auto thd_layout = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t heads,
                        int64_t rs, int64_t off_uid, const char* off_name) {
    t->set_dim({B, heads, S, D}).set_stride({S * heads * rs, rs, heads * rs, 1});
    t->set_ragged_offset(index(off_uid, off_name, B + 1));
  };
  auto input = [&](int64_t uid, const char* name, int64_t heads, int64_t rs, int64_t off_uid, const char* off_name) {
    auto t = g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid));
    thd_layout(t, heads, rs, off_uid, off_name);
    return t;
  };
  auto stats_layout = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t) {
    t->set_data_type(fe::DataType_t::FLOAT).set_dim({B, s.hq, S, 1});
    if (padded_stats) {
      t->set_stride({s.hq * S, S, 1, 1});
    } else {  // lse [Hq, T]: head stride T, token stride 1, sequence b starts at column cu[b]
      t->set_stride({S, s.tokens, 1, 1});
      t->set_ragged_offset(index(kOffStats, "off_stats", B + 1));
    }
  };
  auto q = input(kQ, "q", s.hq, s.rs[oQ], kOffQ, "off_q");
  auto k = input(kK, "k", s.hkv, s.rs[oK], kOffK, "off_k");
  auto v = input(kV, "v", s.hkv, s.rs[oV], kOffV, "off_v");
  auto seq_q = index(kSeqQ, "seq_q", B);
  auto seq_kv = index(kSeqKV, "seq_kv", B);

  if (!s.backward) {
    fe::graph::SDPA_attributes a;
    a.set_name("attention_prefill")
        .set_generate_stats(true)
        .set_attn_scale(s.scale)
        .set_padding_mask(true)
        .set_seq_len_q(seq_q)
        .set_seq_len_kv(seq_kv)
        .set_max_total_seq_len_q(s.tokens)
        .set_max_total_seq_len_kv(s.tokens);
    if (s.causal) a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    if (s.window_left >= 0) a.set_diagonal_band_left_bound(int(s.window_left + 1));
    auto [o, stats] = g->sdpa(q, k, v, a);
    o->set_output(true).set_uid(kO);
    thd_layout(o, s.hq, s.rs[oO], kOffO, "off_o");
    stats->set_output(true).set_uid(kStats);
    stats_layout(stats);
  } else {
    auto o = input(kO, "o", s.hq, s.rs[oO], kOffO, "off_o");
    auto dout = input(kDO, "dout", s.hq, s.rs[oDO], kOffDO, "off_dout");
    auto stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(kStats));
    stats_layout(stats);
    fe::graph::SDPA_backward_attributes a;
    a.set_name("attention_prefill_backward")
        .set_attn_scale(s.scale)
        .set_padding_mask(true)
        .set_seq_len_q(seq_q)
        .set_seq_len_kv(seq_kv)
        .set_max_total_seq_len_q(s.tokens)
        .set_max_total_seq_len_kv(s.tokens);
    if (s.causal) a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    if (s.window_left >= 0) a.set_diagonal_band_left_bound(int(s.window_left + 1));
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, a);
    dq->set_output(true).set_uid(kDQ);
    thd_layout(dq, s.hq, s.rs[oDQ], kOffDQ, "off_dq");
    dk->set_output(true).set_uid(kDK);
    thd_layout(dk, s.hkv, s.rs[oDK], kOffDK, "off_dk");
    dv->set_output(true).set_uid(kDV);
    thd_layout(dv, s.hkv, s.rs[oDV], kOffDV, "off_dv");
  }

  OPFORGE_FE_TRY(g->validate());
  OPFORGE_FE_TRY(g->build_operation_graph(handle));
  OPFORGE_FE_TRY(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  OPFORGE_FE_TRY(g->check_support(handle));
  OPFORGE_FE_TRY(g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE));
  int64_t ws = 0;
  OPFORGE_FE_TRY(g->get_workspace_size(ws));
  plan->graph = std::move(g);
  plan->workspace = ws;
  plan->ok = true;
  return plan;
}

// The plan of a shape: ragged stats first, padded stats when cuDNN declines those. Built once per
// key (the failure too) under the cache mutex; the caller holds the lock.
const Plan& plan_for(const Problem& s) {
  static std::map<std::vector<int64_t>, std::shared_ptr<Plan>> cache;
  static const Plan no_library = [] {
    Plan p;
    p.reason = library().reason;
    return p;
  }();
  if (!library().ok) return no_library;  // the frontend must not run without its library
  const std::vector<int64_t> key = s.key(false);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  std::shared_ptr<Plan> plan;
  try {
    DeviceGuard guard(s.device);
    cudnnHandle_t h = handle_for(s.device);
    // OPFORGE_CUDNN_PADDED_STATS=1 skips the ragged stats (for a library that accepts but
    // mishandles them).
    const char* padded_env = std::getenv("OPFORGE_CUDNN_PADDED_STATS");
    const bool padded_only = padded_env && *padded_env && *padded_env != '0';
    plan = padded_only ? build_plan(s, true, h) : build_plan(s, false, h);
    if (!plan->ok && !padded_only) {
      std::shared_ptr<Plan> padded = build_plan(s, true, h);
      if (padded->ok) plan = padded;
      else plan->reason += "; with padded stats: " + padded->reason;
    }
  } catch (const std::exception& e) {
    plan = std::make_shared<Plan>();
    plan->reason = std::string("cuDNN graph build failed: ") + e.what();
  }
  cache.emplace(key, plan);
  return *plan;
}

// ---- device helpers -----------------------------------------------------------------------------
struct IndexArgs {
  const void* cu;
  int64_t cu_stride;
  bool is64;
  int64_t batch, tokens;
  int32_t* seq_len;  // [B]
  int32_t* offsets;  // [kNumOffsets][B + 1]
  int64_t mult[kNumOffsets];  // offset_b = cu[b] * mult (0: array unused)
};

__device__ __forceinline__ int64_t clamped_cu(const IndexArgs& a, int64_t b) {
  int64_t c = a.is64 ? static_cast<const int64_t*>(a.cu)[b * a.cu_stride]
                     : int64_t(static_cast<const int32_t*>(a.cu)[b * a.cu_stride]);
  return c < 0 ? 0 : (c > a.tokens ? a.tokens : c);
}

__global__ void index_kernel(IndexArgs a) {
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b <= a.batch;
       b += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = clamped_cu(a, b);
    if (b < a.batch) {
      const int64_t n = clamped_cu(a, b + 1) - c;
      a.seq_len[b] = int32_t(n > 0 ? n : 0);
    }
#pragma unroll
    for (int i = 0; i < kNumOffsets; ++i)
      if (a.mult[i] != 0) a.offsets[i * (a.batch + 1) + b] = int32_t(c * a.mult[i]);
  }
}

// Padded stats [B, Hq, S] <-> lse [Hq, T]: token t of sequence b (starts[b] <= t < starts[b] +
// seq_len[b], found by binary search over the clamped starts) is row t - starts[b] of b.
template <bool kToLse>
__global__ void stats_copy_kernel(float* lse, float* padded, const int32_t* starts, const int32_t* seq_len,
                                  int64_t batch, int64_t tokens, int64_t hq) {
  const int64_t n = hq * tokens;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = e / tokens, t = e % tokens;
    int64_t lo = 0, hi = batch - 1;  // the last b with starts[b] <= t
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (starts[mid] <= t) lo = mid;
      else hi = mid - 1;
    }
    const int64_t s = t - starts[lo];
    if (s < 0 || s >= seq_len[lo]) continue;  // no sequence holds t (cu_seqlens not ending at T)
    float* p = padded + (lo * hq + h) * tokens + s;
    if constexpr (kToLse) lse[e] = *p;
    else *p = lse[e];
  }
}

// ---- host side ------------------------------------------------------------------------------------
int64_t row_stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : t.size(-1); }

constexpr size_t align_up(size_t n) { return (n + 255) & ~size_t(255); }

// Runs a plan: derives the index arrays, (gathers padded stats,) executes, (scatters stats).
// `ptrs` maps the graph's tensor uids to device pointers; lse is the op's [Hq, T] tensor.
void run(const Context& ctx, const Problem& s, const TensorView& cu, float* lse,
         std::unordered_map<int64_t, void*>& ptrs) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  const Plan& plan = plan_for(s);
  if (!plan.ok)
    throw Error(ErrorCode::backend, std::string(s.backward ? "attention_prefill_backward" : "attention_prefill") +
                                        ": cuDNN plan unavailable: " + plan.reason);
  DeviceGuard guard(s.device);
  const cudaStream_t stream = stream_of(ctx);
  const int64_t B = s.batch;
  const size_t seq_bytes = align_up(size_t(B) * 4);
  const size_t off_bytes = align_up(size_t(kNumOffsets) * size_t(B + 1) * 4);
  const size_t stats_bytes = plan.padded_stats ? align_up(size_t(B) * size_t(s.hq) * size_t(s.tokens) * 4) : 0;
  const size_t total = seq_bytes + off_bytes + stats_bytes + size_t(plan.workspace);
  char* ws = static_cast<char*>(cuda_workspace(ctx, int64_t(total)));
  auto* seq_len = reinterpret_cast<int32_t*>(ws);
  auto* offsets = reinterpret_cast<int32_t*>(ws + seq_bytes);
  auto* padded = reinterpret_cast<float*>(ws + seq_bytes + off_bytes);
  void* cudnn_ws = plan.workspace > 0 ? ws + seq_bytes + off_bytes + stats_bytes : nullptr;

  IndexArgs a{};
  a.cu = cu.data;
  a.cu_stride = cu.numel() > 1 ? cu.stride(0) : 1;
  a.is64 = cu.dtype == DType::i64;
  a.batch = B;
  a.tokens = s.tokens;
  a.seq_len = seq_len;
  a.offsets = offsets;
  const int last = s.backward ? kNumOffsets : oStats + 1;
  for (int i = 0; i < last; ++i) {
    const int64_t heads = (i == oK || i == oV || i == oDK || i == oDV) ? s.hkv : s.hq;
    a.mult[i] = i == oStats ? 1 : heads * s.rs[i];  // oStats: the plain starts cu[b]
  }
  index_kernel<<<grid_for(B + 1, 256), 256, 0, stream>>>(a);
  check_launch("attention_prefill cudnn index kernel launch");

  ptrs[kSeqQ] = seq_len;
  ptrs[kSeqKV] = seq_len;
  const int64_t uid_of[kNumOffsets] = {kOffQ, kOffK, kOffV, kOffO, kOffStats, kOffDO, kOffDQ, kOffDK, kOffDV};
  for (int i = 0; i < last; ++i)
    if (i != oStats || !plan.padded_stats) ptrs[uid_of[i]] = offsets + i * (B + 1);
  const int32_t* starts = offsets + oStats * (B + 1);
  const unsigned stats_grid = grid_for(s.hq * s.tokens, 256);
  if (plan.padded_stats) {
    ptrs[kStats] = padded;
    if (s.backward) {  // rows past a sequence's length stay 0 (cuDNN masks them)
      OPFORGE_CUDA_CHECK(cudaMemsetAsync(padded, 0, stats_bytes, stream));
      stats_copy_kernel<false><<<stats_grid, 256, 0, stream>>>(lse, padded, starts, seq_len, B, s.tokens, s.hq);
      check_launch("attention_prefill_backward cudnn stats gather launch");
    }
  } else {
    ptrs[kStats] = lse;
  }

  cudnnHandle_t handle = handle_for(s.device);
  const cudnnStatus_t st = fe::detail::set_stream(handle, stream);
  if (st != CUDNN_STATUS_SUCCESS)
    throw Error(ErrorCode::backend, std::string("cudnnSetStream failed: ") + fe::detail::get_error_string(st));
  fe::error_t status = [&]() -> fe::error_t {
    try {
      return plan.graph->execute(handle, ptrs, cudnn_ws);
    } catch (const std::exception& e) {  // the frontend throws when a dynamically loaded symbol is missing
      return {fe::error_code_t::GRAPH_EXECUTION_FAILED, e.what()};
    }
  }();
  if (status.is_bad())
    throw Error(ErrorCode::backend, std::string(s.backward ? "attention_prefill_backward" : "attention_prefill") +
                                        ": cuDNN execute failed: " + status.get_message());
  if (plan.padded_stats && !s.backward) {
    stats_copy_kernel<true><<<stats_grid, 256, 0, stream>>>(lse, padded, starts, seq_len, B, s.tokens, s.hq);
    check_launch("attention_prefill cudnn stats scatter launch");
  }
}

// ---- the impls ------------------------------------------------------------------------------------
Problem shape_of(const TensorView& q, const TensorView& k, const TensorView& cu, bool causal,
               double softmax_scale, int64_t window_left, bool backward) {
  Problem s;
  s.device = q.device.index;
  s.dtype = q.dtype;
  s.batch = cu.numel() - 1;
  s.tokens = q.size(0);
  s.hq = q.size(1);
  s.hkv = k.size(1);
  s.d = q.size(2);
  s.causal = causal;
  s.window_left = window_left < s.tokens ? window_left : -1;  // a window of T or more excludes no key
  s.scale = float(attention_scale(softmax_scale, q.size(2)));
  s.backward = backward;
  return s;
}

// The checks every call of either op passes before a graph is built (static reasons).
const char* common_problem(const TensorView& lse, const TensorView& q, const TensorView& cu,
                           std::initializer_list<const TensorView*> rows) {
  if (q.dtype != DType::bf16 && q.dtype != DType::f16) return "dtype is not bf16 or f16";
  if (lse.dtype != DType::f32) return "lse is not f32";
  const int64_t d = q.size(2);
  if (d % 8 != 0 || d > 256) return "head_dim is not a multiple of 8 up to 256";
  if (cu.numel() < 2) return "no sequences (cu_seqlens has one entry)";
  if (q.numel() == 0) return nullptr;  // nothing to do; the kernel returns at once
  const int64_t tokens = q.size(0);
  if (lse.stride(1) != 1 || (q.size(1) > 1 && lse.stride(0) != tokens)) return "lse is not a contiguous [Hq, T]";
  for (const TensorView* t : rows) {
    if (const char* why = pack_rows_problem(*t, d)) return why;
    if (tokens * t->size(1) * row_stride_of(*t) >= (int64_t(1) << 31)) return "a tensor spans 2^31 elements or more (int32 ragged offsets)";
  }
  if (!library().ok) return library().reason.c_str();
  return nullptr;
}

const char* plan_problem(const Problem& s) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  const Plan& p = plan_for(s);
  return p.ok ? nullptr : p.reason.c_str();
}

}  // namespace
}  // namespace cuda::attention_cudnn

using cuda::attention_cudnn::Problem;

void attention_prefill_cudnn(const Context& ctx, const TensorView& out, const TensorView& lse,
                             const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& cu_seqlens, bool causal, double softmax_scale,
                             int64_t window_left) {
  namespace c = cuda::attention_cudnn;
  if (q.numel() == 0) return;
  Problem s = c::shape_of(q, k, cu_seqlens, causal, softmax_scale, window_left, false);
  s.rs[c::oQ] = c::row_stride_of(q), s.rs[c::oK] = c::row_stride_of(k);
  s.rs[c::oV] = c::row_stride_of(v), s.rs[c::oO] = c::row_stride_of(out);
  std::unordered_map<int64_t, void*> ptrs = {{c::kQ, q.data}, {c::kK, k.data}, {c::kV, v.data}, {c::kO, out.data}};
  c::run(ctx, s, cu_seqlens, static_cast<float*>(lse.data), ptrs);
}

const char* attention_prefill_cudnn_applicable(const TensorView& out, const TensorView& lse,
                                               const TensorView& q, const TensorView& k,
                                               const TensorView& v, const TensorView& cu_seqlens,
                                               bool causal, double softmax_scale, int64_t window_left) {
  namespace c = cuda::attention_cudnn;
  if (const char* why = c::common_problem(lse, q, cu_seqlens, {&out, &q, &k, &v})) return why;
  if (q.numel() == 0 || q.device.is_cpu()) return nullptr;
  // A batch of one token (sequence bound T = 1): cuDNN left lse of every head past the first
  // unwritten (H200, cuDNN 9 from pip, 2026-11-26); the other kernels serve it.
  if (q.size(0) < 2) return "a single token (cuDNN leaves lse unwritten past head 0 at T = 1)";
  Problem s = c::shape_of(q, k, cu_seqlens, causal, softmax_scale, window_left, false);
  s.rs[c::oQ] = c::row_stride_of(q), s.rs[c::oK] = c::row_stride_of(k);
  s.rs[c::oV] = c::row_stride_of(v), s.rs[c::oO] = c::row_stride_of(out);
  return c::plan_problem(s);
}

namespace {
Problem backward_shape(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                     const TensorView& dout, const TensorView& q, const TensorView& k,
                     const TensorView& v, const TensorView& out, const TensorView& cu, bool causal,
                     double softmax_scale, int64_t window_left) {
  namespace c = cuda::attention_cudnn;
  Problem s = c::shape_of(q, k, cu, causal, softmax_scale, window_left, true);
  s.rs[c::oQ] = c::row_stride_of(q), s.rs[c::oK] = c::row_stride_of(k);
  s.rs[c::oV] = c::row_stride_of(v), s.rs[c::oO] = c::row_stride_of(out);
  s.rs[c::oDO] = c::row_stride_of(dout), s.rs[c::oDQ] = c::row_stride_of(dq);
  s.rs[c::oDK] = c::row_stride_of(dk), s.rs[c::oDV] = c::row_stride_of(dv);
  return s;
}
}  // namespace

void attention_prefill_backward_cudnn(const Context& ctx, const TensorView& dq, const TensorView& dk,
                                      const TensorView& dv, const TensorView& dout,
                                      const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse,
                                      const TensorView& cu_seqlens, bool causal,
                                      double softmax_scale, int64_t window_left) {
  namespace c = cuda::attention_cudnn;
  if (q.numel() == 0) return;
  const Problem s = backward_shape(dq, dk, dv, dout, q, k, v, out, cu_seqlens, causal, softmax_scale, window_left);
  std::unordered_map<int64_t, void*> ptrs = {{c::kQ, q.data},     {c::kK, k.data},   {c::kV, v.data},
                                             {c::kO, out.data},   {c::kDO, dout.data}, {c::kDQ, dq.data},
                                             {c::kDK, dk.data},   {c::kDV, dv.data}};
  c::run(ctx, s, cu_seqlens, static_cast<float*>(lse.data), ptrs);
}

const char* attention_prefill_backward_cudnn_applicable(
    const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
    const TensorView& lse, const TensorView& cu_seqlens, bool causal, double softmax_scale,
    int64_t window_left) {
  namespace c = cuda::attention_cudnn;
  if (const char* why = c::common_problem(lse, q, cu_seqlens, {&dq, &dk, &dv, &dout, &q, &k, &v, &out}))
    return why;
  if (q.numel() == 0 || q.device.is_cpu()) return nullptr;
  return c::plan_problem(backward_shape(dq, dk, dv, dout, q, k, v, out, cu_seqlens, causal, softmax_scale, window_left));
}

void register_attention_prefill_cudnn(Registry& reg) {
  auto probe = [] { return cuda::attention_cudnn::availability(); };
  KernelDesc fwd = cuda_kernel_desc(
      "cudnn", 400,
      "cuDNN fused attention (SDPA graph, THD ragged layout, padding + causal / band mask, GQA): "
      "cuDNN's flash-attention engine, libcudnn loaded at run time",
      false);
  fwd.dtypes = {DType::f16, DType::bf16};
  fwd.properties.batch_invariant = false;  // the plan depends on the batch's B and T
  fwd.probe = probe;
  reg.add_kernel<AttentionPrefill>(fwd, &attention_prefill_cudnn, &attention_prefill_cudnn_applicable);
  KernelDesc bwd = cuda_kernel_desc(
      "cudnn", 400,
      "cuDNN fused attention backward (SDPA backward graph from out and lse, GQA dK / dV summed by "
      "cuDNN), libcudnn loaded at run time",
      false);
  bwd.dtypes = {DType::f16, DType::bf16};
  bwd.properties.batch_invariant = false;
  bwd.properties.deterministic = false;  // dQ is accumulated with atomics
  bwd.probe = probe;
  // Not registered: on an H200 (2026-11-26) its dq / dk missed the f64 reference by 1.5-2x the
  // bf16 / f16 grad tolerances in 12 of 110 grad-mode cases (several sequences, windows, GQA,
  // non-causal), e.g. bf16 dq 0.363 against 0.338. Whether that is cuDNN's 16-bit dS or a
  // mapping error here is not settled; tests/attention_cuda_test.cpp still runs it against the
  // plain kernel, and the plain cuda kernel serves the op.
  (void)bwd;
}

}  // namespace opforge

#else  // !OPFORGE_WITH_CUDNN

namespace opforge {
void register_attention_prefill_cudnn(Registry&) {}  // built without cuDNN's headers: no impl
}  // namespace opforge

#endif  // OPFORGE_WITH_CUDNN
