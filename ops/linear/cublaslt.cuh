// cuBLASLt GEMMs of the linear family (ops/linear/cuda.cu: linear; ops/linear/flce_cuda.cu:
// fused_linear_cross_entropy), through one handle per device and one algorithm cache
// (Note [cublaslt cache], ops/linear/cuda.cu).
#pragma once

#include <cstdint>

#include "opforge/op.h"

namespace opforge::cuda::lt {

// The cuBLASLt workspace a call may use (the caller provides it: Note [cuda workspace]).
inline constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;

// A row-major operand: op(X) = X (stored [rows, cols]) or X^T (trans: X stored [cols, rows]);
// `ld` is the stored row stride in elements.
struct Operand {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t ld = 0;
  bool trans = false;
};

// D [m, n] (row-major, row stride ldd) = op(A) [m, k] . op(B) [k, n] + beta * D (+ bias [n] of
// D's dtype through the BIAS epilogue). A and B share one dtype (f32, f16 or bf16); D has theirs
// or f32. CUBLAS_COMPUTE_32F (f32 accumulation, never TF32), split-K partial sums in f32 only.
struct Gemm {
  int64_t m = 0, n = 0, k = 0;
  Operand a, b;
  void* d = nullptr;
  DType d_dtype = DType::f32;
  int64_t ldd = 0;
  float beta = 0.0f;
  const void* bias = nullptr;
};

// Enqueues the product on ctx's stream with `workspace` (kWorkspaceBytes of device memory, not
// used by anything else until the product has run). Returns false when cuBLASLt has no algorithm
// for it (then nothing was enqueued). Requires m, n, k >= 1.
bool matmul(const Context& ctx, const Gemm& g, void* workspace);

}  // namespace opforge::cuda::lt
