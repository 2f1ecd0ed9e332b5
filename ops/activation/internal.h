// Activation family internals shared by activation.cpp, cpu.cpp and cases.cpp (not public).
#pragma once

#include <vector>

#include "ops/activation/activation.h"

namespace opforge {

// ---- cpu.cpp: Highway + OpenMP kernels ----------------------------------------------------------
void silu_and_mul_cpu(const Context&, const TensorView& y, const TensorView& x);
void silu_and_mul_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                               const TensorView& x);
const char* silu_and_mul_cpu_applicable(const TensorView& y, const TensorView& x);
const char* silu_and_mul_backward_cpu_applicable(const TensorView& dx, const TensorView& dy,
                                                 const TensorView& x);

// ---- cases.cpp ----------------------------------------------------------------------------------
std::vector<Case> silu_and_mul_cases();
std::vector<Case> silu_and_mul_backward_cases();

// ---- what cpu.cpp's per-target code receives (plain data; strides in elements) ----------------
// A tile: rows [row_begin, row_end) x columns [col_begin, col_end) of the d = hidden / 2 outputs.
struct GatedRows {
  DType dtype = DType::f32;
  int64_t d = 0;  // half of x's last dim
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* dy = nullptr;  // backward only
  int64_t dy_stride = 0;
  void* out = nullptr;  // y (forward, [.., d]) or dx (backward, [.., 2d])
  int64_t out_stride = 0;
};

}  // namespace opforge
