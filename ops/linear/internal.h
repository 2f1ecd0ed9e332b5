// Linear family internals shared by linear.cpp, the kernels and cases.cpp (not installed).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "ops/linear/linear.h"

namespace opforge {

// ---- cpu.cpp: OpenBLAS GEMMs -----------------------------------------------------------------
void linear_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                const TensorView& b);
void linear_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                         const TensorView& db, const TensorView& dy, const TensorView& x,
                         const TensorView& w);
const char* linear_cpu_applicable(const TensorView& y, const TensorView& x, const TensorView& w,
                                  const TensorView& b);
const char* linear_backward_cpu_applicable(const TensorView& dx, const TensorView& dw,
                                           const TensorView& db, const TensorView& dy,
                                           const TensorView& x, const TensorView& w);

// ---- flce_cpu.cpp --------------------------------------------------------------------------------
void fused_linear_cross_entropy_cpu(const Context&, const TensorView& loss,
                                    const TensorView& lse, const TensorView& hidden,
                                    const TensorView& w,
                                    const TensorView& target, const TensorView& b,
                                    int64_t ignore_index, double label_smoothing,
                                    std::string_view reduction);
void fused_linear_cross_entropy_backward_cpu(
    const Context&, const TensorView& dhidden, const TensorView& dw, const TensorView& db,
    const TensorView& dloss, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& lse, const TensorView& b, int64_t ignore_index,
    double label_smoothing, std::string_view reduction);
const char* fused_linear_cross_entropy_cpu_applicable(const TensorView& loss,
                                                      const TensorView& lse,
                                                      const TensorView& hidden,
                                                      const TensorView& w,
                                                      const TensorView& target,
                                                      const TensorView& b, int64_t, double,
                                                      std::string_view);
const char* fused_linear_cross_entropy_backward_cpu_applicable(
    const TensorView& dhidden, const TensorView& dw, const TensorView& db,
    const TensorView& dloss, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& lse, const TensorView& b, int64_t, double,
    std::string_view);

void fused_linear_cross_entropy_with_grad_cpu(
    const Context&, const TensorView& loss, const TensorView& lse, const TensorView& dhidden,
    const TensorView& dw, const TensorView& db, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& dloss, const TensorView& b, int64_t ignore_index,
    double label_smoothing, std::string_view reduction);
const char* fused_linear_cross_entropy_with_grad_cpu_applicable(
    const TensorView& loss, const TensorView& lse, const TensorView& dhidden, const TensorView& dw,
    const TensorView& db, const TensorView& hidden, const TensorView& w, const TensorView& target,
    const TensorView& dloss, const TensorView& b, int64_t, double, std::string_view);

// Note [flce chunks] (flce_cpu.cpp): the token rows and vocab rows one chunk of the cpu kernel
// covers, and the scratch bytes a call allocates (the largest amount held at once).
struct FlceChunks {
  int64_t token_rows = 0;  // tokens per chunk
  int64_t vocab_rows = 0;  // rows of w converted to f32 at a time (16-bit dtypes)
};
FlceChunks flce_chunks(int64_t tokens, int64_t vocab, int64_t hidden);
// Peak scratch bytes of the last fused_linear_cross_entropy(_backward)_cpu call on this thread.
int64_t flce_cpu_last_scratch_bytes();

// ---- linear.cpp ---------------------------------------------------------------------------------
enum class Reduction : uint8_t { none, sum, mean };
Reduction parse_reduction(std::string_view op, std::string_view text);  // throws on bad text
// Tokens whose target is not ignore_index.
int64_t count_targets(const TensorView& target, int64_t ignore_index);
int64_t target_at(const TensorView& target, int64_t n);

// ---- cases.cpp ----------------------------------------------------------------------------------
std::vector<Case> linear_cases();
std::vector<Case> linear_backward_cases();
std::vector<Case> fused_linear_cross_entropy_cases();
std::vector<Case> fused_linear_cross_entropy_backward_cases();
std::vector<Case> fused_linear_cross_entropy_with_grad_cases();

}  // namespace opforge

// ---- gemm.cpp: f32 GEMM and f32 panels of the cpu kernels -------------------------------------
//
// Every product goes through OpenBLAS's cblas_sgemm (row major). The Debian OpenBLAS (0.3.21) is
// built without BUILD_BFLOAT16: its header declares cblas_sbgemm but the library has no such
// symbol, so bf16 and f16 operands are widened to f32 panels first (exact), multiplied in f32, and
// the f32 results rounded once into the 16-bit outputs (Note [rounding]).
namespace opforge::gemm_cpu {

// C[m, n] = A[m, k] . B[k, n] (op(A) = A^T when trans_a, op(B) = B^T when trans_b) + beta * C.
// k == 0 writes beta * C (C = 0 for beta 0); m == 0 or n == 0 does nothing.
// Note [one thread pool]: OpenBLAS is set to one thread (openblas_set_num_threads(1), once per
// process) and OpenMP, which the rest of opforge uses, splits C into one block per thread along
// its longer side. Two pools (OpenMP's and OpenBLAS's pthreads) taking turns on the same cores
// cost a wake-up per hand-over, ruinous on a loaded machine; one pool has one fork per product.
// No block splits k, so the sums (and the results) are the same for any thread count. Must not
// be called from inside an OpenMP parallel region.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// sum_i a[i] b[i] on the calling thread (OpenBLAS's sdot; for use inside an OpenMP task).
float sdot_serial(int64_t n, const float* a, const float* b);

// The same product on the calling thread only (for use inside an OpenMP task).
void sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Rows [row_begin, row_end) of a row-layout matrix as f32: the tensor's own memory for f32 (no
// copy, ld = its row stride), else a dense widened copy (ld = cols). Rows are flattened leading
// dims (Note [row layout]).
struct F32Panel {
  const float* data = nullptr;
  int64_t ld = 0;
  std::unique_ptr<float[]> owned;
};
F32Panel f32_rows(const TensorView& t, int64_t row_begin, int64_t row_end);
// Widens rows [row_begin, row_end) of `t` into dst (dense, ld = cols); OpenMP over row tasks.
void widen_rows(const TensorView& t, int64_t row_begin, int64_t row_end, float* dst);

// On the calling thread: columns [col_begin, col_begin + cols) of rows [row_begin, row_end) of
// `t` widened into dst (dense, ld = cols).
void widen_block_serial(const TensorView& t, int64_t row_begin, int64_t row_end, int64_t col_begin,
                        int64_t cols, float* dst);
// On the calling thread: dst[row, col_begin + j] = src[(row - row_begin) * ld + j] rounded, rows
// [row_begin, row_end), j in [0, cols).
void store_block_serial(const float* src, int64_t ld, const TensorView& dst, int64_t row_begin,
                        int64_t row_end, int64_t col_begin, int64_t cols);

// dst[row, col_begin + j] = src[row * ld + j] rounded to dst's dtype, for rows of dst and j in
// [0, cols); OpenMP over row tasks.
void store_rows(const float* src, int64_t ld, const TensorView& dst, int64_t col_begin,
                int64_t cols);

// Sum over the rows of a row-layout matrix into out[j] (f32, in row order: deterministic),
// OpenMP over column blocks; rows may be 0 (out = 0).
void column_sums(const TensorView& t, float* out);

// Bytes of f32 scratch currently held by F32Panel / the kernels' buffers, and the peak since the
// last reset (for the memory figures of fused_linear_cross_entropy).
struct ScratchMeter {
  int64_t now = 0, peak = 0;
  void add(int64_t bytes) { now += bytes; peak = now > peak ? now : peak; }
  void sub(int64_t bytes) { now -= bytes; }
};
// A float buffer that reports its bytes to a meter while alive.
class Scratch {
 public:
  Scratch(ScratchMeter& meter, int64_t floats);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return data_.get(); }

 private:
  ScratchMeter* meter_;
  int64_t bytes_;
  std::unique_ptr<float[]> data_;
};

}  // namespace opforge::gemm_cpu
