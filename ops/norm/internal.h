// Norm family internals shared by norm.cpp, cpu.cpp and cases.cpp (not installed, not public).
#pragma once

#include <vector>

#include "ops/norm/norm.h"

namespace opforge {

// ---- cpu.cpp: Highway + OpenMP kernels ----------------------------------------------------------
void rms_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                  double eps, double offset);
void rms_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                           const TensorView& dy, const TensorView& x, const TensorView& w,
                           double eps, double offset);
void fused_add_rms_norm_cpu(const Context&, const TensorView& y, const TensorView& s,
                            const TensorView& x, const TensorView& residual, const TensorView& w,
                            double eps, double offset);
void fused_add_rms_norm_backward_cpu(const Context&, const TensorView& dx,
                                     const TensorView& dresidual, const TensorView& dw,
                                     const TensorView& dy, const TensorView& ds,
                                     const TensorView& x, const TensorView& residual,
                                     const TensorView& w, double eps, double offset);

// Applicability predicates of the cpu kernels: nullptr when they accept the arguments.
const char* rms_norm_cpu_applicable(const TensorView& y, const TensorView& x, const TensorView& w,
                                    double eps, double offset);
const char* rms_norm_backward_cpu_applicable(const TensorView& dx, const TensorView& dw,
                                             const TensorView& dy, const TensorView& x,
                                             const TensorView& w, double eps, double offset);
const char* fused_add_rms_norm_cpu_applicable(const TensorView& y, const TensorView& s,
                                              const TensorView& x, const TensorView& residual,
                                              const TensorView& w, double eps, double offset);
const char* fused_add_rms_norm_backward_cpu_applicable(
    const TensorView& dx, const TensorView& dresidual, const TensorView& dw, const TensorView& dy,
    const TensorView& ds, const TensorView& x, const TensorView& residual, const TensorView& w,
    double eps, double offset);

// ---- cases.cpp ----------------------------------------------------------------------------------
std::vector<Case> rms_norm_cases();
std::vector<Case> rms_norm_backward_cases();
std::vector<Case> fused_add_rms_norm_cases();
std::vector<Case> fused_add_rms_norm_backward_cases();

// ---- what cpu.cpp's per-target code receives (plain data; strides in elements) ----------------
// Forward rows of rms_norm (residual == nullptr) or fused_add_rms_norm.
struct NormForwardRows {
  DType dtype = DType::f32;
  int64_t hidden = 0;
  float eps = 0, offset = 0;
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* residual = nullptr;  // fused only
  int64_t residual_stride = 0;
  const void* w = nullptr;
  void* y = nullptr;
  int64_t y_stride = 0;
  void* s = nullptr;  // fused only
  int64_t s_stride = 0;
};

// Backward rows of rms_norm (residual == nullptr) or fused_add_rms_norm.
struct NormBackwardRows {
  DType dtype = DType::f32;
  int64_t hidden = 0;
  float eps = 0, offset = 0;
  const void* dy = nullptr;
  int64_t dy_stride = 0;
  const void* ds = nullptr;  // fused only
  int64_t ds_stride = 0;
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* residual = nullptr;  // fused only
  int64_t residual_stride = 0;
  const void* w = nullptr;
  void* dx = nullptr;
  int64_t dx_stride = 0;
  void* dresidual = nullptr;  // fused only
  int64_t dresidual_stride = 0;
};

}  // namespace opforge
