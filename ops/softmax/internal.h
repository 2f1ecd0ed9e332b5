// Softmax family internals shared by softmax.cpp, cpu.cpp and cases.cpp (not public).
#pragma once

#include <vector>

#include "ops/softmax/softmax.h"

namespace opforge {

enum class SoftmaxKind : uint8_t { softmax, log_softmax, sparsemax };

// cpu.cpp: Highway + OpenMP kernels.
void softmax_cpu(const Context&, const TensorView& y, const TensorView& x);
void log_softmax_cpu(const Context&, const TensorView& y, const TensorView& x);
void sparsemax_cpu(const Context&, const TensorView& y, const TensorView& x);
void softmax_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                          const TensorView& y);
void log_softmax_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                              const TensorView& y);
void sparsemax_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                            const TensorView& y);
const char* softmax_forward_cpu_applicable(const TensorView& y, const TensorView& x);
const char* softmax_backward_cpu_applicable(const TensorView& dx, const TensorView& dy,
                                            const TensorView& y);

// cases.cpp
std::vector<Case> softmax_forward_cases();
std::vector<Case> softmax_backward_cases();
std::vector<Case> log_softmax_backward_cases();
std::vector<Case> sparsemax_forward_cases();
std::vector<Case> sparsemax_backward_cases();

// What cpu.cpp's per-target code receives (plain data; strides in elements).
struct SoftmaxRows {
  SoftmaxKind kind = SoftmaxKind::softmax;
  DType dtype = DType::f32;
  int64_t n = 0;      // row length
  int64_t block = 0;  // elements per L1 block of a row (Note [tiling])
  const void* in = nullptr;  // x (forward) or dy (backward)
  int64_t in_stride = 0;
  const void* y = nullptr;  // backward: the saved forward output
  int64_t y_stride = 0;
  void* out = nullptr;  // y (forward) or dx (backward)
  int64_t out_stride = 0;
  int64_t rows = 0;     // the call's rows (the last one prefetches nothing past them)
  bool stream = false;  // out by streaming stores (Note [streaming stores])
};

}  // namespace opforge
