// Activation family: silu_and_mul and its backward.
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

struct SiluAndMul {
  static constexpr const char* name = "silu_and_mul";
  static constexpr const char* backward = "silu_and_mul_backward";
  using Signature = void(const TensorView& y, const TensorView& x);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out}, {"x", ArgRole::in}};
  static constexpr const char* doc =
      "x: [..., 2d], y: [..., d]; y = silu(x[..., :d]) * x[..., d:] with silu(a) = a / (1 + e^-a), "
      "computed in f32 and rounded once (vLLM's silu_and_mul; Liger rounds silu(a) to the dtype "
      "before the multiply).";
  static void check(const TensorView& y, const TensorView& x);
};

struct SiluAndMulBackward {
  static constexpr const char* name = "silu_and_mul_backward";
  using Signature = void(const TensorView& dx, const TensorView& dy, const TensorView& x);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out}, {"dy", ArgRole::in}, {"x", ArgRole::in}};
  static constexpr const char* doc =
      "Backward of silu_and_mul. With a = x[..., :d], b = x[..., d:], s = sigmoid(a): "
      "dx[..., :d] = dy * b * s * (1 + a * (1 - s)), dx[..., d:] = dy * a * s.";
  static void check(const TensorView& dx, const TensorView& dy, const TensorView& x);
};

void silu_and_mul_reference(const Context&, const TensorView& y, const TensorView& x);
void silu_and_mul_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                     const TensorView& x);

void register_activation(Registry& reg);
void register_activation_cuda(Registry& reg);

}  // namespace opforge
