// CUDA kernels of linear: y = x @ w^T + b.
//
// Technique.
//  - cuda_cublaslt (priority 200): one cuBLASLt matmul. In cuBLAS's column-major terms the
//    row-major y [M, N] is D = N x M with ld = y's row stride, D = op(A) * B with A = w seen as a
//    K x N column-major matrix (ld = w's row stride) transposed, and B = x seen as K x M (ld = x's
//    row stride): the "TN" layout, so padded rows of x, w and y are passed as leading dimensions and
//    nothing is copied. Compute type CUBLAS_COMPUTE_32F with f32 scale for every dtype (f32
//    accumulation; true f32 for f32 inputs, never TF32); the bias goes through the
//    CUBLASLT_EPILOGUE_BIAS epilogue, added in f32 before the one rounding to the output dtype,
//    as the op's doc asks. Odd sizes (K, N or a row stride not a multiple of 8) are legal for
//    cuBLASLt: the alignment of every pointer is measured (largest power of two dividing the
//    address and the row stride in bytes, capped at 256) and passed as the MIN_ALIGNMENT
//    preferences, so the heuristic only returns algorithms that handle it. Split-K partial sums
//    are allowed only in f32 (REDUCTION_SCHEME_MASK: none or compute type).
//    Note [cublaslt cache]: the cuBLASLt handle is created once per device; the 32 MiB workspace
//    is the backend's per-(device, stream) buffer (Note [cuda workspace]), allocated on the first
//    call and reused, so calls on different streams never share one; the algorithm chosen by
//    the heuristic is cached per (device, dtypes, transposes, M, N, K, leading dims, bias,
//    alignments), so a hot call does one mutex-guarded map lookup, stack-initialized descriptors
//    (the *Init functions, no host allocation) and one cublasLtMatmul on the Context's stream; no
//    host synchronization and no device allocation after the first call of a shape. The same
//    algorithm for the same shape gives the same bits run to run (deterministic; not batch
//    invariant: M picks the algorithm). K = 0 (y = b) and shapes for which the heuristic returns
//    nothing take the tiled kernel (the `cuda` impl) instead. The GEMM (cuda::lt::matmul,
//    ops/linear/cublaslt.cuh) also serves fused_linear_cross_entropy (ops/linear/flce_cuda.cu).
//  - cuda (priority 100): any layout, the tiled GEMM of ops/linear/tiled_gemm.cuh (64 x 64 output
//    tiles, f32 accumulation, the bias added before the one rounding, int64 offsets).
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "backends/cuda/cuda_launch.cuh"
#include "ops/linear/cublaslt.cuh"
#include "ops/linear/linear_cuda.h"
#include "ops/linear/tiled_gemm.cuh"

namespace opforge {
namespace cuda::linear {
namespace {

int64_t ld_of(const TensorView& t, int64_t cols) { return t.rows() > 1 ? t.row_stride() : std::max<int64_t>(cols, 1); }

// ---- tiled fallback (ops/linear/tiled_gemm.cuh): y = x w^T + b as D = A B with A = x, B(k, j) = w[j, k] --
void run_tiled(const Context& ctx, const TensorView& y, const TensorView& x, const TensorView& w,
               const TensorView& b) {
  const int64_t m = x.rows(), n = w.size(0), k = x.size(-1);
  dispatch_float(x.dtype, "linear", [&](auto tag) {
    using T = decltype(tag);
    tiled::TiledArgs<T, T> p{};
    p.a = x.ptr<T>(), p.a_row = ld_of(x, k), p.a_col = 1;
    p.b = w.ptr<T>(), p.b_row = 1, p.b_col = ld_of(w, k);
    p.bias = b.defined() ? b.ptr<T>() : nullptr;
    p.d = y.ptr<T>(), p.ldd = ld_of(y, n), p.m = m, p.n = n, p.k = k, p.beta = 0.0f;
    tiled::launch_tiled(ctx, p, "linear_cuda kernel launch");
  });
}

// ---- cuBLASLt ------------------------------------------------------------------------------------

}  // namespace
}  // namespace cuda::linear

namespace cuda::lt {
namespace {

[[noreturn]] void throw_cublas(const char* what, cublasStatus_t status) {
  throw Error(ErrorCode::backend, std::string(what) + " failed: " + cublasLtGetStatusName(status) +
                                      " (" + cublasLtGetStatusString(status) + ")");
}
void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]] throw_cublas(what, status);
}

// Note [cublaslt cache]: handles per device and chosen algorithms per problem.
struct LtCache {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;
  // (device, A/B dtype, D dtype, trans a, trans b, m, n, k, lda, ldb, ldd, bias, align a, b, d,
  // bias) -> algorithm (or none).
  using Key = std::tuple<int, int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                         uint32_t, uint32_t, uint32_t, uint32_t>;
  std::map<Key, std::pair<bool, cublasLtMatmulAlgo_t>> algos;
};
LtCache& lt_cache() {
  static LtCache* cache = new LtCache;  // never destroyed: handles outlive static destructors
  return *cache;
}

cublasLtHandle_t handle_for(LtCache& c, int device) {  // c.mutex held
  auto it = c.handles.find(device);
  if (it != c.handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  check_lt(cublasLtCreate(&h), "cublasLtCreate");
  c.handles.emplace(device, h);
  return h;
}

// Largest power of two (<= 256) dividing the address and the row stride in bytes.
uint32_t alignment_of(const void* p, int64_t ld_bytes) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p) | uint64_t(ld_bytes) | 256u;
  return uint32_t(bits & (~bits + 1));
}

cudaDataType_t lt_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : t == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

struct LtDescs {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;
  cublasLtMatmulDesc_t op_desc() { return reinterpret_cast<cublasLtMatmulDesc_t>(&op); }
  cublasLtMatrixLayout_t a_desc() { return reinterpret_cast<cublasLtMatrixLayout_t>(&a); }
  cublasLtMatrixLayout_t b_desc() { return reinterpret_cast<cublasLtMatrixLayout_t>(&b); }
  cublasLtMatrixLayout_t d_desc() { return reinterpret_cast<cublasLtMatrixLayout_t>(&d); }
};

}  // namespace

// Row-major D = op(A) op(B) is column-major D^T = op(B)^T op(A)^T, and a row-major [r, c] matrix
// with row stride ld is the column-major [c, r] matrix with leading dimension ld. So cuBLASLt's
// first operand is B: for op(B) = B (stored [k, n]) the column-major n x k layout untransposed,
// for op(B) = B^T (stored [n, k]) the k x n layout transposed; its second operand is A likewise
// (k x m untransposed, or m x k transposed), and D is the n x m layout. For linear (A = x,
// B = w transposed) this is the "TN" layout: nothing is copied, padded rows are leading dims.
bool matmul(const Context& ctx, const Gemm& g, void* workspace) {
  const int64_t in_item = dtype_size(g.a.dtype), d_item = dtype_size(g.d_dtype);
  const bool bias = g.bias != nullptr;

  LtDescs s;
  check_lt(cublasLtMatmulDescInit(s.op_desc(), CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescInit");
  const cublasOperation_t trans_a = g.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = g.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(s.op_desc(), CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
           "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_lt(cublasLtMatmulDescSetAttribute(s.op_desc(), CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
           "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const void* bias_ptr = g.bias;
    check_lt(cublasLtMatmulDescSetAttribute(s.op_desc(), CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
             "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    check_lt(cublasLtMatmulDescSetAttribute(s.op_desc(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                            sizeof(bias_ptr)),
             "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  const cudaDataType_t in_type = lt_type(g.a.dtype);
  const uint64_t m = uint64_t(g.m), n = uint64_t(g.n), k = uint64_t(g.k);
  check_lt(cublasLtMatrixLayoutInit(s.a_desc(), in_type, g.b.trans ? k : n, g.b.trans ? n : k, g.b.ld),
           "cublasLtMatrixLayoutInit(B operand)");
  check_lt(cublasLtMatrixLayoutInit(s.b_desc(), in_type, g.a.trans ? m : k, g.a.trans ? k : m, g.a.ld),
           "cublasLtMatrixLayoutInit(A operand)");
  check_lt(cublasLtMatrixLayoutInit(s.d_desc(), lt_type(g.d_dtype), n, m, g.ldd), "cublasLtMatrixLayoutInit(D)");

  const uint32_t align_a = alignment_of(g.a.data, g.a.ld * in_item), align_b = alignment_of(g.b.data, g.b.ld * in_item),
                 align_d = alignment_of(g.d, g.ldd * d_item), align_bias = bias ? alignment_of(g.bias, 0) : 256u;

  LtCache& c = lt_cache();
  cublasLtHandle_t handle;
  std::pair<bool, cublasLtMatmulAlgo_t> algo;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    handle = handle_for(c, ctx.device.index);
    const LtCache::Key key{ctx.device.index, int(g.a.dtype), int(g.d_dtype), g.a.trans, g.b.trans, g.m, g.n, g.k,
                           g.a.ld, g.b.ld, g.ldd, bias, align_a, align_b, align_d, align_bias};
    auto it = c.algos.find(key);
    if (it == c.algos.end()) {
      cublasLtMatmulPreferenceOpaque_t pref_storage;
      auto pref = reinterpret_cast<cublasLtMatmulPreference_t>(&pref_storage);
      check_lt(cublasLtMatmulPreferenceInit(pref), "cublasLtMatmulPreferenceInit");
      const uint64_t ws_bytes = uint64_t(kWorkspaceBytes);
      check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                    sizeof(ws_bytes)),
               "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
      const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> aligns{{
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},  // cuBLASLt's A is our B
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d},
      }};
      // Split-K partial sums only in f32 (the compute type): the in-place scheme would add the
      // parts in the output dtype, rounding each one.
      const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                    sizeof(schemes)),
               "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
      for (const auto& [attr, value] : aligns)
        check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
                 "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t status =
          cublasLtMatmulAlgoGetHeuristic(handle, s.op_desc(), s.a_desc(), s.b_desc(), s.d_desc(),
                                         s.d_desc(), pref, 1, &result, &found);
      const bool ok = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
      it = c.algos.emplace(key, std::make_pair(ok, result.algo)).first;
    }
    algo = it->second;
  }
  if (!algo.first) return false;
  const float alpha = 1.0f, beta = g.beta;
  check_lt(cublasLtMatmul(handle, s.op_desc(), &alpha, g.b.data, s.a_desc(), g.a.data, s.b_desc(), &beta, g.d,
                          s.d_desc(), g.d, s.d_desc(), &algo.second, workspace, size_t(kWorkspaceBytes),
                          stream_of(ctx)),
           "cublasLtMatmul");
  return true;
}

}  // namespace cuda::lt

namespace cuda::linear {
namespace {

// Returns false when cuBLASLt has no algorithm for this problem (the caller takes the tiled
// kernel).
bool run_cublaslt(const Context& ctx, const TensorView& y, const TensorView& x, const TensorView& w,
                  const TensorView& b) {
  const int64_t k = x.size(-1);
  lt::Gemm g;
  g.m = x.rows(), g.n = w.size(0), g.k = k;
  g.a = lt::Operand{x.data, x.dtype, ld_of(x, k), false};
  g.b = lt::Operand{w.data, w.dtype, ld_of(w, k), true};
  g.d = y.data, g.d_dtype = y.dtype, g.ldd = ld_of(y, g.n);
  g.bias = b.defined() ? b.data : nullptr;
  return lt::matmul(ctx, g, cuda_workspace(ctx, lt::kWorkspaceBytes));
}

}  // namespace
}  // namespace cuda::linear

void linear_cuda_cublaslt(const Context& ctx, const TensorView& y, const TensorView& x,
                          const TensorView& w, const TensorView& b) {
  if (x.rows() == 0 || w.size(0) == 0) return;
  cuda::DeviceGuard guard(ctx.device.index);
  if (x.size(-1) > 0 && cuda::linear::run_cublaslt(ctx, y, x, w, b)) return;
  cuda::linear::run_tiled(ctx, y, x, w, b);
}
const char* linear_cuda_cublaslt_applicable(const TensorView&, const TensorView& x,
                                            const TensorView&, const TensorView& b) {
  if (!cuda::is_cuda_float(x.dtype)) return cuda::kNotCudaFloat;
  if (b.defined() && !cuda::aligned16(b.data)) return "b is not 16-byte aligned";
  return nullptr;
}

void linear_cuda(const Context& ctx, const TensorView& y, const TensorView& x, const TensorView& w,
                 const TensorView& b) {
  if (x.rows() == 0 || w.size(0) == 0) return;
  cuda::DeviceGuard guard(ctx.device.index);
  cuda::linear::run_tiled(ctx, y, x, w, b);
}
const char* linear_cuda_applicable(const TensorView&, const TensorView& x, const TensorView&,
                                   const TensorView&) {
  return cuda::is_cuda_float(x.dtype) ? nullptr : cuda::kNotCudaFloat;
}

void register_linear_cuda(Registry& reg) {
  // f32 sums of `in` products in another order than the reference's (as the cpu GEMM).
  auto desc = [](const char* impl, int priority, const char* summary) {
    KernelDesc d = cuda_kernel_desc(impl, priority, summary, false);
    d.tolerances[DType::f32] = {1e-4, 1e-4, 1e-9};
    return d;
  };
  KernelDesc lt = desc("cuda_cublaslt", 200,
                       "cuBLASLt TN GEMM, f32 compute, bias in the epilogue, algorithm cached per shape");
  lt.properties.batch_invariant = false;  // the heuristic's algorithm depends on the row count
  reg.add_kernel<Linear>(lt, &linear_cuda_cublaslt, &linear_cuda_cublaslt_applicable);
  reg.add_kernel<Linear>(desc("cuda", 100, "any layout: 64x64 shared-memory tiles, 4x4 per thread, f32 sums"),
                         &linear_cuda, &linear_cuda_applicable);
  register_flce_cuda(reg);
}

}  // namespace opforge
