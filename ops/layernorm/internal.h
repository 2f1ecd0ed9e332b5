// Layernorm family internals shared by layernorm.cpp, cpu.cpp, cpu_dyt.cpp and cases.cpp (not
// installed, not public).
#pragma once

#include <vector>

#include "ops/layernorm/layernorm.h"

namespace opforge {

// ---- cpu.cpp / cpu_dyt.cpp: Highway + OpenMP kernels -------------------------------------------
void layer_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, double eps);
void layer_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                             const TensorView& db, const TensorView& dy, const TensorView& x,
                             const TensorView& w, double eps);
void group_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, int64_t num_groups, double eps);
void group_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                             const TensorView& db, const TensorView& dy, const TensorView& x,
                             const TensorView& w, int64_t num_groups, double eps);
void dyt_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& alpha,
             const TensorView& gamma, const TensorView& beta);
void dyt_backward_cpu(const Context&, const TensorView& dx, const TensorView& dalpha,
                      const TensorView& dgamma, const TensorView& dbeta, const TensorView& dy,
                      const TensorView& x, const TensorView& alpha, const TensorView& gamma);

// Note [ordered partials] (cpu.cpp): dst[j] = sum over parts p, in order, in f64, of
// partials[p * columns + j], rounded once to dst's dtype. dst is [columns].
void reduce_partials_in_order(const float* partials, int64_t n_parts, int64_t columns,
                              const TensorView& dst);

// The cpu kernels take f32, bf16 and f16 on the cpu: nullptr when `x` qualifies, else why not.
const char* layernorm_cpu_reason(const TensorView& x);

const char* layer_norm_cpu_applicable(const TensorView& y, const TensorView& x,
                                      const TensorView& w, const TensorView& b, double eps);
const char* layer_norm_backward_cpu_applicable(const TensorView& dx, const TensorView& dw,
                                               const TensorView& db, const TensorView& dy,
                                               const TensorView& x, const TensorView& w,
                                               double eps);
const char* group_norm_cpu_applicable(const TensorView& y, const TensorView& x,
                                      const TensorView& w, const TensorView& b,
                                      int64_t num_groups, double eps);
const char* group_norm_backward_cpu_applicable(const TensorView& dx, const TensorView& dw,
                                               const TensorView& db, const TensorView& dy,
                                               const TensorView& x, const TensorView& w,
                                               int64_t num_groups, double eps);
const char* dyt_cpu_applicable(const TensorView& y, const TensorView& x, const TensorView& alpha,
                               const TensorView& gamma, const TensorView& beta);
const char* dyt_backward_cpu_applicable(const TensorView& dx, const TensorView& dalpha,
                                        const TensorView& dgamma, const TensorView& dbeta,
                                        const TensorView& dy, const TensorView& x,
                                        const TensorView& alpha, const TensorView& gamma);

// ---- cases.cpp ----------------------------------------------------------------------------------
std::vector<Case> layer_norm_cases();
std::vector<Case> layer_norm_backward_cases();
std::vector<Case> group_norm_cases();
std::vector<Case> group_norm_backward_cases();
std::vector<Case> dyt_cases();
std::vector<Case> dyt_backward_cases();

// ---- what the per-target code receives (plain data; strides in elements) ----------------------
// Rows of layer_norm (forward: dy == nullptr) or of its backward.
struct LayerNormRows {
  DType dtype = DType::f32;
  int64_t hidden = 0;
  float eps = 0;
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* w = nullptr;
  const void* b = nullptr;  // forward; may be nullptr (no bias)
  void* y = nullptr;        // forward
  int64_t y_stride = 0;
  const void* dy = nullptr;  // backward
  int64_t dy_stride = 0;
  void* dx = nullptr;  // backward
  int64_t dx_stride = 0;
  bool stream = false;  // Note [streaming stores] for y (forward) or dx (backward)
  int64_t rows = 0;     // rows of the call (the next-row prefetch crosses tasks)
};

// group_norm (forward: dy == nullptr) or its backward; every tensor contiguous. Group (n, g) is
// the run of channels_per_group * spatial elements at (n * groups + g) * that length.
struct GroupNormArgs {
  DType dtype = DType::f32;
  int64_t batch = 0, channels = 0, groups = 0, spatial = 0;
  float eps = 0;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* b = nullptr;  // forward
  void* y = nullptr;        // forward
  const void* dy = nullptr;  // backward
  void* dx = nullptr;        // backward
  bool stream = false;       // forward: Note [streaming stores] for y
};

// Rows of dyt (forward: dy == nullptr) or of its backward.
struct DytRows {
  DType dtype = DType::f32;
  int64_t hidden = 0;
  float alpha = 0;
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* gamma = nullptr;
  const void* beta = nullptr;  // forward; may be nullptr
  void* y = nullptr;           // forward
  int64_t y_stride = 0;
  const void* dy = nullptr;  // backward
  int64_t dy_stride = 0;
  void* dx = nullptr;  // backward
  int64_t dx_stride = 0;
};

}  // namespace opforge
