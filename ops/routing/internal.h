// Routing family internals shared by routing.cpp, reference.cpp, cpu.cpp and cases.cpp.
#pragma once

#include <vector>

#include "ops/routing/routing.h"

namespace opforge {

// What both routing kernels receive (plain data; strides in elements). topk_softmax is the
// grouped form with one group, softmax scores, no bias and a scaling factor of 1.
struct RoutingPlan {
  DType dtype = DType::f32;
  const void* logits = nullptr;
  int64_t logits_stride = 0;
  int64_t tokens = 0, experts = 0, topk = 0;
  int64_t groups = 1, topk_group = 1;
  bool sigmoid = false;
  bool renormalize = false;
  const void* bias = nullptr;  // nullptr: none; else [experts] of bias_dtype, contiguous
  DType bias_dtype = DType::f32;
  int64_t bias_stride = 1;
  double scaling = 1.0;
  float* weights = nullptr;
  int64_t weights_stride = 0;
  int32_t* ids = nullptr;
  int64_t ids_stride = 0;
};

RoutingPlan topk_softmax_plan(const TensorView& topk_weights, const TensorView& topk_ids,
                              const TensorView& gating_output, int64_t topk, bool renormalize);
RoutingPlan grouped_topk_plan(const TensorView& topk_weights, const TensorView& topk_ids,
                              const TensorView& gating_output, const TensorView& bias,
                              int64_t topk, bool renormalize, int64_t num_expert_group,
                              int64_t topk_group, std::string_view scoring_func,
                              double routed_scaling_factor);

void routing_reference_run(const RoutingPlan& p);
void routing_cpu_run(const RoutingPlan& p);
const char* routing_cpu_dtype_reason(const TensorView& gating_output);

std::vector<Case> topk_softmax_cases();
std::vector<Case> grouped_topk_cases();

// moe_permute / moe_unpermute (moe.cpp; strides in elements, 0 for a single row).
struct MoePermutePlan {
  DType dtype = DType::f32;
  const void* x = nullptr;
  int64_t x_stride = 0;
  int64_t tokens = 0, hidden = 0, topk = 0, experts = 0;
  const int32_t* ids = nullptr;  // [tokens * topk], contiguous
  void* out = nullptr;
  int64_t out_stride = 0;
  int64_t* offsets = nullptr;  // [experts + 1]
  void* inv = nullptr;         // [tokens * topk], i32 or i64
  bool inv_i64 = false;
};
struct MoeUnpermutePlan {
  DType dtype = DType::f32;
  const void* in = nullptr;
  int64_t in_stride = 0;
  int64_t tokens = 0, topk = 0, hidden = 0;
  const void* inv = nullptr;
  bool inv_i64 = false;
  const float* weights = nullptr;  // [tokens, topk], contiguous
  void* y = nullptr;
  int64_t y_stride = 0;
  bool stream = false;  // the CPU kernel: y by streaming stores (Note [streaming stores])
};
MoePermutePlan moe_permute_plan(const TensorView& permuted, const TensorView& expert_offsets,
                                const TensorView& inv_perm, const TensorView& x,
                                const TensorView& topk_ids, int64_t num_experts);
MoeUnpermutePlan moe_unpermute_plan(const TensorView& y, const TensorView& expert_out,
                                    const TensorView& inv_perm, const TensorView& topk_weights);
void moe_unpermute_cpu_run(const MoeUnpermutePlan& p);  // cpu_moe.cpp
void register_moe(Registry& reg);

}  // namespace opforge
