// CUDA kernels of the quant family (ops/quant/cuda.cu), declared for registration and for tests
// that call them directly. Two kernels, as in ops/norm/norm_cuda.h:
//   quant_fp8_cuda        any layout the op's check accepts (scalar loads); predicate: dtype only
//   quant_fp8_cuda_vec16  16-byte loads of x, 4- or 8-byte stores of q; predicate: alignment and
//                         sizes
// A predicate returns nullptr when its kernel accepts the arguments, else a static reason.
#pragma once

#include <string_view>

#include "ops/quant/quant.h"

namespace opforge {

void quant_fp8_cuda(const Context&, const TensorView& q, const TensorView& scale,
                    const TensorView& x, const TensorView& static_scale, std::string_view mode,
                    double scale_ub);
const char* quant_fp8_cuda_applicable(const TensorView& q, const TensorView& scale,
                                      const TensorView& x, const TensorView& static_scale,
                                      std::string_view mode, double scale_ub);
void quant_fp8_cuda_vec16(const Context&, const TensorView& q, const TensorView& scale,
                          const TensorView& x, const TensorView& static_scale,
                          std::string_view mode, double scale_ub);
const char* quant_fp8_cuda_vec16_applicable(const TensorView& q, const TensorView& scale,
                                            const TensorView& x, const TensorView& static_scale,
                                            std::string_view mode, double scale_ub);

//   quant_fp8_cuda_vec16_coop  per_tensor mode, contiguous x and q: one cooperative launch
//                              (Note [one-launch per-tensor quant] in cuda.cu)
void quant_fp8_cuda_vec16_coop(const Context&, const TensorView& q, const TensorView& scale,
                               const TensorView& x, const TensorView& static_scale,
                               std::string_view mode, double scale_ub);
const char* quant_fp8_cuda_vec16_coop_applicable(const TensorView& q, const TensorView& scale,
                                                 const TensorView& x,
                                                 const TensorView& static_scale,
                                                 std::string_view mode, double scale_ub);

void register_quant_cuda(Registry& reg);

}  // namespace opforge
