// Norm family internals shared by norm.cpp, cpu.cpp, cases.cpp and the CUDA registrations (not
// installed, not public).
#pragma once

#include <string_view>
#include <vector>

#include "ops/norm/norm.h"

namespace opforge {

// Note [f32 dw tolerance] (ops/norm/cuda.cu) for the cpu and CUDA backward kernels of the rms_norm
// family: their dw sums dy*x*r over every row in f32 (chunk partials, then an ordered sum of the
// partials) while the reference sums in f64; on the cpu over 2,400 rows the difference reached
// 6e-5, past the default f32 atol of 1e-5. These kernels allow 1e-4.
inline KernelDesc with_f32_dw_tolerance(KernelDesc d) {
  Tolerance f32 = default_tolerance(DType::f32);
  f32.atol = 1e-4;
  d.tolerances[DType::f32] = f32;
  return d;
}

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

// ---- norm.cpp: checks shared by the family (op names the op in errors) ------------------------
void norm_check_x_and_w(const char* op, const TensorView& x, const TensorView& w);
void norm_check_like_x(const char* op, const char* arg, const TensorView& t, const TensorView& x);
void norm_check_dw(const char* op, const TensorView& dw, const TensorView& w);
void check_rms_norm(const char* op, const TensorView& y, const TensorView& x, const TensorView& w,
                    double eps, double offset);
void check_rms_norm_backward(const char* op, const TensorView& dx, const TensorView& dw,
                             const TensorView& dy, const TensorView& x, const TensorView& w,
                             double eps, double offset);
void check_fused_add_rms_norm(const char* op, const TensorView& y, const TensorView& s,
                              const TensorView& x, const TensorView& residual,
                              const TensorView& w, double eps, double offset);
void check_fused_add_rms_norm_backward(const char* op, const TensorView& dx,
                                       const TensorView& dresidual, const TensorView& dw,
                                       const TensorView& dy, const TensorView& ds,
                                       const TensorView& x, const TensorView& residual,
                                       const TensorView& w, double eps, double offset);
// variants.cpp: gemma_*, rms_norm_gated, poly_norm and their backward ops.
void norm_check_scalars(const char* op, double eps, double offset);
void register_norm_variants(Registry& reg);

// ---- rms_norm_gated's activation argument ------------------------------------------------------
enum class GateActivation { silu, sigmoid };
// "silu" or "swish" -> silu, "sigmoid" -> sigmoid; false for anything else.
bool parse_gate_activation(std::string_view name, GateActivation& out);
// Elements per normalised group: group_size, or the whole row when it is 0.
inline int64_t gate_group(int64_t hidden, int64_t group_size) {
  return group_size > 0 ? group_size : hidden;
}

// ---- cpu_variants.cpp: rms_norm_gated and poly_norm -------------------------------------------
void rms_norm_gated_cpu(const Context&, const TensorView& y, const TensorView& x,
                        const TensorView& z, const TensorView& w, double eps, int64_t group_size,
                        bool norm_before_gate, std::string_view activation);
void rms_norm_gated_backward_cpu(const Context&, const TensorView& dx, const TensorView& dz,
                                 const TensorView& dw, const TensorView& dy, const TensorView& x,
                                 const TensorView& z, const TensorView& w, double eps,
                                 int64_t group_size, bool norm_before_gate,
                                 std::string_view activation);
void poly_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                   const TensorView& b, double eps);
void poly_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                            const TensorView& db, const TensorView& dy, const TensorView& x,
                            const TensorView& w, double eps);
const char* rms_norm_gated_cpu_applicable(const TensorView& y, const TensorView& x,
                                          const TensorView& z, const TensorView& w, double eps,
                                          int64_t group_size, bool norm_before_gate,
                                          std::string_view activation);
const char* rms_norm_gated_backward_cpu_applicable(
    const TensorView& dx, const TensorView& dz, const TensorView& dw, const TensorView& dy,
    const TensorView& x, const TensorView& z, const TensorView& w, double eps, int64_t group_size,
    bool norm_before_gate, std::string_view activation);
const char* poly_norm_cpu_applicable(const TensorView& y, const TensorView& x, const TensorView& w,
                                     const TensorView& b, double eps);
const char* poly_norm_backward_cpu_applicable(const TensorView& dx, const TensorView& dw,
                                              const TensorView& db, const TensorView& dy,
                                              const TensorView& x, const TensorView& w,
                                              double eps);
// cpu.cpp: why the cpu kernels do not run these tensors (device, dtype), or nullptr.
const char* norm_cpu_dtype_reason(const TensorView& x);

// ---- cases.cpp ----------------------------------------------------------------------------------
std::vector<Case> rms_norm_cases();
std::vector<Case> rms_norm_backward_cases();
std::vector<Case> fused_add_rms_norm_cases();
std::vector<Case> fused_add_rms_norm_backward_cases();
std::vector<Case> gemma_rms_norm_cases();
std::vector<Case> gemma_rms_norm_backward_cases();
std::vector<Case> gemma_fused_add_rms_norm_cases();
std::vector<Case> gemma_fused_add_rms_norm_backward_cases();
std::vector<Case> rms_norm_gated_cases();
std::vector<Case> rms_norm_gated_backward_cases();
std::vector<Case> poly_norm_cases();
std::vector<Case> poly_norm_backward_cases();

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
  bool stream = false;  // outputs by non-temporal stores (Note [streaming stores])
  int64_t rows = 0;     // rows of the call: a task's last row prefetches the next task's first
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
  bool stream = false;  // outputs by non-temporal stores (Note [streaming stores])
};

// What cpu_variants.cpp's per-target code receives (plain data; strides in elements).
struct GatedNormRows {
  DType dtype = DType::f32;
  int64_t hidden = 0, group = 0;
  float eps = 0;
  bool norm_before_gate = false, sigmoid_gate = false;
  bool stream = false;  // the forward's y by non-temporal stores (Note [streaming stores])
  const void *x = nullptr, *z = nullptr, *w = nullptr, *dy = nullptr;
  int64_t x_stride = 0, z_stride = 0, dy_stride = 0;
  void *y = nullptr, *dx = nullptr, *dz = nullptr;
  int64_t y_stride = 0, dx_stride = 0, dz_stride = 0;
};

struct PolyRows {
  DType dtype = DType::f32;
  int64_t hidden = 0;
  float eps = 0;
  float w[3] = {0, 0, 0}, b = 0;
  const void *x = nullptr, *dy = nullptr;
  int64_t x_stride = 0, dy_stride = 0;
  void *y = nullptr, *dx = nullptr;
  int64_t y_stride = 0, dx_stride = 0;
  int64_t rows = 0;     // the rows (the last one prefetches nothing past the call)
  bool stream = false;  // y (forward) or dx (backward) by streaming stores (Note [streaming stores])
};

// Per-chunk sums of poly_norm_backward: r_p * S_p for p = 1, 2, 3, and sum(dy).
struct PolyPartial {
  double dw[4] = {0, 0, 0, 0};
  double db = 0;
};

}  // namespace opforge
