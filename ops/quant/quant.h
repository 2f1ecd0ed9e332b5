// Quant family: quant_fp8 (e4m3fn with per-tensor dynamic, per-token dynamic or static scales).
//
// Greppable chain: op `quant_fp8` -> quant_fp8_reference (reference.cpp), quant_fp8_cpu
// (cpu.cpp). Cases in cases.cpp, checks / shapes / costs in quant.cpp.
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

// Note [fp8 quantization]: all arithmetic is f32, as vLLM's x.float() * (1 / s), so every kernel
// produces the same bits: amax = max |x| (NaN elements ignored); s = max(amax / 448,
// 1 / (448 * 512)); inv = 1 / s (one f32 division); q = f8e4m3(x * inv) with Note [fp8 e4m3]
// (round to nearest even, saturating to +-448, a NaN quotient is the canonical NaN byte 0x7f).
struct QuantFp8 {
  static constexpr const char* name = "quant_fp8";
  using Signature = void(const TensorView& q, const TensorView& scale, const TensorView& x,
                         const TensorView& static_scale, std::string_view mode, double scale_ub);
  static constexpr ArgSpec args[] = {{"q", ArgRole::out},
                                     {"scale", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"static_scale", ArgRole::opt_in},
                                     {"mode", ArgRole::scalar, "per_tensor"},
                                     {"scale_ub", ArgRole::scalar, "0"}};
  static constexpr const char* doc =
      "vLLM's QuantFP8 to e4m3fn (Note [fp8 quantization]). x: [..., hidden] floating (rows may "
      "be padded); q: x's shape, f8e4m3; scale: f32, the dequantization scale (x ~ q * scale). "
      "mode 'per_tensor': one dynamic scale, scale [1], s = max(max|x| / 448, 1/(448*512)). "
      "'per_token': one dynamic scale per row, scale [..., 1], with the row's amax first clamped "
      "to scale_ub when scale_ub > 0. 'static': s = static_scale[0] (f32 [1], finite, > 0), "
      "copied to scale. x is widened to f32 first (f64 inputs round to f32). Differs from vLLM: "
      "no group shapes, UE8M0 scales or token padding.";
  static void check(const TensorView& q, const TensorView& scale, const TensorView& x,
                    const TensorView& static_scale, std::string_view mode, double scale_ub);
};

void register_quant(Registry& reg);  // quant.cpp: op, reference + cpu kernels, cases

}  // namespace opforge
