// Linear family internals shared by linear.cpp, the kernels and cases.cpp (not installed).
#pragma once

#include <cstdint>
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
                                    const TensorView& hidden, const TensorView& w,
                                    const TensorView& target, const TensorView& b,
                                    int64_t ignore_index, double label_smoothing,
                                    std::string_view reduction);
void fused_linear_cross_entropy_backward_cpu(
    const Context&, const TensorView& dhidden, const TensorView& dw, const TensorView& db,
    const TensorView& dloss, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& b, int64_t ignore_index, double label_smoothing,
    std::string_view reduction);
const char* fused_linear_cross_entropy_cpu_applicable(const TensorView& loss,
                                                      const TensorView& hidden,
                                                      const TensorView& w,
                                                      const TensorView& target,
                                                      const TensorView& b, int64_t, double,
                                                      std::string_view);
const char* fused_linear_cross_entropy_backward_cpu_applicable(
    const TensorView& dhidden, const TensorView& dw, const TensorView& db,
    const TensorView& dloss, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& b, int64_t, double, std::string_view);

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

}  // namespace opforge
