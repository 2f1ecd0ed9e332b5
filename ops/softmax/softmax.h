// Softmax family: softmax, log_softmax, sparsemax over the last dim, and their backward ops.
//
// Greppable chain: op `softmax` -> softmax_reference (reference.cpp), softmax_cpu (cpu.cpp).
// Checks, shapes and costs in softmax.cpp, cases in cases.cpp. Rows follow Note [row layout]
// (ops/norm/norm.h).
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

// Every forward op of the family: y = f(x) row by row; y may alias x exactly (in place).
#define OPFORGE_SOFTMAX_FORWARD_ARGS                                                              \
  using Signature = void(const TensorView& y, const TensorView& x);                               \
  static constexpr ArgSpec args[] = {{"y", ArgRole::out}, {"x", ArgRole::in}};                    \
  static void check(const TensorView& y, const TensorView& x);

// Every backward op: dx from the upstream dy and the saved forward output y; dx may alias dy.
#define OPFORGE_SOFTMAX_BACKWARD_ARGS                                                             \
  using Signature = void(const TensorView& dx, const TensorView& dy, const TensorView& y);        \
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dy", ArgRole::in}, {"y", ArgRole::in}}; \
  static void check(const TensorView& dx, const TensorView& dy, const TensorView& y);

struct Softmax {
  static constexpr const char* name = "softmax";
  static constexpr const char* backward = "softmax_backward";
  OPFORGE_SOFTMAX_FORWARD_ARGS
  static constexpr const char* doc =
      "y = exp(x - m) / sum(exp(x - m)) over the last dim, m = max of the row; x, y: [..., n], "
      "one floating dtype. Statistics in f32 (f64 for f64), y rounded once. Same function as "
      "torch.softmax(x, -1) and Liger's softmax; y may alias x (in place).";
};

struct SoftmaxBackward {
  static constexpr const char* name = "softmax_backward";
  OPFORGE_SOFTMAX_BACKWARD_ARGS
  static constexpr const char* doc =
      "Backward of softmax from the saved output: dx = y * (dy - sum(dy * y)) per row "
      "(only y is saved, as in Liger). dx may alias dy.";
};

struct LogSoftmax {
  static constexpr const char* name = "log_softmax";
  static constexpr const char* backward = "log_softmax_backward";
  OPFORGE_SOFTMAX_FORWARD_ARGS
  static constexpr const char* doc =
      "y = x - m - log(sum(exp(x - m))) over the last dim (torch.log_softmax(x, -1)); "
      "statistics in f32 (f64 for f64), y rounded once; y may alias x (in place).";
};

struct LogSoftmaxBackward {
  static constexpr const char* name = "log_softmax_backward";
  OPFORGE_SOFTMAX_BACKWARD_ARGS
  static constexpr const char* doc =
      "Backward of log_softmax from the saved output: dx = dy - exp(y) * sum(dy) per row. "
      "dx may alias dy.";
};

struct Sparsemax {
  static constexpr const char* name = "sparsemax";
  static constexpr const char* backward = "sparsemax_backward";
  OPFORGE_SOFTMAX_FORWARD_ARGS
  static constexpr const char* doc =
      "Sparsemax over the last dim (Martins & Astudillo 2016): y = max(x - tau, 0) with tau the "
      "unique value where sum(max(x - tau, 0)) = 1, i.e. tau = (sum of the k largest - 1) / k "
      "for the support size k. Same function as Liger's sparsemax (dim = -1); opforge finds tau "
      "without sorting (Michelot's fixed point, exact on the final support). y may alias x.";
};

struct SparsemaxBackward {
  static constexpr const char* name = "sparsemax_backward";
  OPFORGE_SOFTMAX_BACKWARD_ARGS
  static constexpr const char* doc =
      "Backward of sparsemax from the saved output: dx_i = [y_i > 0] * (dy_i - mean of dy over "
      "the support {y > 0}). dx may alias dy.";
};

#undef OPFORGE_SOFTMAX_FORWARD_ARGS
#undef OPFORGE_SOFTMAX_BACKWARD_ARGS

// Reference kernels (reference.cpp).
void softmax_reference(const Context&, const TensorView& y, const TensorView& x);
void log_softmax_reference(const Context&, const TensorView& y, const TensorView& x);
void sparsemax_reference(const Context&, const TensorView& y, const TensorView& x);
void softmax_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                const TensorView& y);
void log_softmax_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                    const TensorView& y);
void sparsemax_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                  const TensorView& y);

void register_softmax(Registry& reg);  // softmax.cpp

}  // namespace opforge
