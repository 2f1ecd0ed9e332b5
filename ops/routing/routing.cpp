// Routing family: checks, plans, shape functions, cost models and registration (routing.h).
#include <cmath>
#include <string>

#include "opforge/checks.h"
#include "opforge/error.h"
#include "ops/routing/internal.h"

namespace opforge {

namespace {

// gating_output [T, E], outputs f32 / i32 [T, topk] with unit-stride rows; 1 <= topk <= limit.
void check_routing_common(const char* op, const TensorView& weights, const TensorView& ids,
                          const TensorView& logits, int64_t topk, int64_t limit,
                          const char* limit_what) {
  expect_row_tensor(op, "gating_output", logits);
  if (logits.ndim != 2)
    throw_argument_error(op, "gating_output", "2 dims [tokens, experts]", logits.shape_of().str());
  if (logits.size(1) < 1)
    throw_argument_error(op, "gating_output", "at least one expert", logits.shape_of().str());
  if (topk < 1 || topk > limit)
    throw_argument_error(op, "topk", "a value in [1, " + std::to_string(limit) + "] (" + limit_what + ")",
                         std::to_string(topk));
  const Shape out_shape{logits.size(0), topk};
  expect_defined(op, "topk_weights", weights);
  expect_dtype(op, "topk_weights", weights, DType::f32);
  expect_shape(op, "topk_weights", weights, out_shape);
  expect_rows_uniform(op, "topk_weights", weights);
  expect_same_device(op, "topk_weights", weights, "gating_output", logits);
  expect_defined(op, "topk_ids", ids);
  expect_dtype(op, "topk_ids", ids, DType::i32);
  expect_shape(op, "topk_ids", ids, out_shape);
  expect_rows_uniform(op, "topk_ids", ids);
  expect_same_device(op, "topk_ids", ids, "gating_output", logits);
  expect_no_overlap(op, "topk_weights", weights, "gating_output", logits);
  expect_no_overlap(op, "topk_ids", ids, "gating_output", logits);
  expect_no_overlap(op, "topk_ids", ids, "topk_weights", weights);
}

RoutingPlan base_plan(const TensorView& weights, const TensorView& ids, const TensorView& logits,
                      int64_t topk, bool renormalize) {
  RoutingPlan p;
  p.dtype = logits.dtype;
  p.logits = logits.data;
  p.tokens = logits.size(0);
  p.experts = logits.size(1);
  p.logits_stride = p.tokens > 0 ? logits.row_stride() : 0;
  p.topk = topk;
  p.renormalize = renormalize;
  p.weights = static_cast<float*>(weights.data);
  p.weights_stride = p.tokens > 0 ? weights.row_stride() : 0;
  p.ids = static_cast<int32_t*>(ids.data);
  p.ids_stride = p.tokens > 0 ? ids.row_stride() : 0;
  return p;
}

}  // namespace

void TopkSoftmax::check(const TensorView& topk_weights, const TensorView& topk_ids,
                        const TensorView& gating_output, int64_t topk, bool) {
  expect_defined(name, "gating_output", gating_output);
  const int64_t experts = gating_output.ndim == 2 ? gating_output.size(1) : 0;
  check_routing_common(name, topk_weights, topk_ids, gating_output, topk, experts,
                       "the number of experts");
}

void GroupedTopk::check(const TensorView& topk_weights, const TensorView& topk_ids,
                        const TensorView& gating_output, const TensorView& bias, int64_t topk,
                        bool, int64_t num_expert_group, int64_t topk_group,
                        std::string_view scoring_func, double routed_scaling_factor) {
  expect_row_tensor(name, "gating_output", gating_output);
  if (gating_output.ndim != 2)
    throw_argument_error(name, "gating_output", "2 dims [tokens, experts]", gating_output.shape_of().str());
  const int64_t experts = gating_output.size(1);
  if (num_expert_group < 1 || experts % num_expert_group != 0)
    throw_argument_error(name, "num_expert_group",
                         "a positive divisor of the number of experts " + std::to_string(experts),
                         std::to_string(num_expert_group));
  if (topk_group < 1 || topk_group > num_expert_group)
    throw_argument_error(name, "topk_group", "a value in [1, num_expert_group = " + std::to_string(num_expert_group) + "]",
                         std::to_string(topk_group));
  const int64_t group_size = experts / num_expert_group;
  check_routing_common(name, topk_weights, topk_ids, gating_output, topk, topk_group * group_size,
                       "the experts of topk_group groups");
  if (scoring_func != "softmax" && scoring_func != "sigmoid")
    throw_argument_error(name, "scoring_func", "'softmax' or 'sigmoid'", "'" + std::string(scoring_func) + "'");
  expect_finite_scalar(name, "routed_scaling_factor", routed_scaling_factor);
  if (routed_scaling_factor <= 0)
    throw_argument_error(name, "routed_scaling_factor", "a value > 0", std::to_string(routed_scaling_factor));
  if (bias.defined()) {
    expect_floating(name, "e_score_correction_bias", bias);
    expect_shape(name, "e_score_correction_bias", bias, Shape{experts});
    expect_same_device(name, "e_score_correction_bias", bias, "gating_output", gating_output);
    if (group_size < 2)
      throw_argument_error(name, "e_score_correction_bias",
                           "groups of at least 2 experts (a group's score sums its top 2)",
                           "groups of " + std::to_string(group_size));
    expect_no_overlap(name, "topk_weights", topk_weights, "e_score_correction_bias", bias);
    expect_no_overlap(name, "topk_ids", topk_ids, "e_score_correction_bias", bias);
  }
}

RoutingPlan topk_softmax_plan(const TensorView& topk_weights, const TensorView& topk_ids,
                              const TensorView& gating_output, int64_t topk, bool renormalize) {
  return base_plan(topk_weights, topk_ids, gating_output, topk, renormalize);
}

RoutingPlan grouped_topk_plan(const TensorView& topk_weights, const TensorView& topk_ids,
                              const TensorView& gating_output, const TensorView& bias,
                              int64_t topk, bool renormalize, int64_t num_expert_group,
                              int64_t topk_group, std::string_view scoring_func,
                              double routed_scaling_factor) {
  RoutingPlan p = base_plan(topk_weights, topk_ids, gating_output, topk, renormalize);
  p.groups = num_expert_group;
  p.topk_group = topk_group;
  p.sigmoid = scoring_func == "sigmoid";
  p.scaling = routed_scaling_factor;
  if (bias.defined()) {
    p.bias = bias.data;
    p.bias_dtype = bias.dtype;
    p.bias_stride = bias.stride(0);
  }
  return p;
}

namespace {

void topk_softmax_reference(const Context&, const TensorView& w, const TensorView& ids,
                            const TensorView& logits, int64_t topk, bool renormalize) {
  routing_reference_run(topk_softmax_plan(w, ids, logits, topk, renormalize));
}
void topk_softmax_cpu(const Context&, const TensorView& w, const TensorView& ids,
                      const TensorView& logits, int64_t topk, bool renormalize) {
  routing_cpu_run(topk_softmax_plan(w, ids, logits, topk, renormalize));
}
const char* topk_softmax_cpu_applicable(const TensorView&, const TensorView&,
                                        const TensorView& logits, int64_t, bool) {
  return routing_cpu_dtype_reason(logits);
}

void grouped_topk_reference(const Context&, const TensorView& w, const TensorView& ids,
                            const TensorView& logits, const TensorView& bias, int64_t topk,
                            bool renormalize, int64_t groups, int64_t topk_group,
                            std::string_view scoring, double scaling) {
  routing_reference_run(grouped_topk_plan(w, ids, logits, bias, topk, renormalize, groups,
                                          topk_group, scoring, scaling));
}
void grouped_topk_cpu(const Context&, const TensorView& w, const TensorView& ids,
                      const TensorView& logits, const TensorView& bias, int64_t topk,
                      bool renormalize, int64_t groups, int64_t topk_group,
                      std::string_view scoring, double scaling) {
  routing_cpu_run(grouped_topk_plan(w, ids, logits, bias, topk, renormalize, groups, topk_group,
                                    scoring, scaling));
}
const char* grouped_topk_cpu_applicable(const TensorView&, const TensorView&,
                                        const TensorView& logits, const TensorView& bias,
                                        int64_t, bool, int64_t, int64_t, std::string_view, double) {
  if (bias.defined() && bias.dtype == DType::f64) return "an f64 bias is served by the reference kernel";
  return routing_cpu_dtype_reason(logits);
}

std::vector<OutputSpec> routing_outputs(const ArgList& a) {
  const TensorView& logits = a.tensor("gating_output");
  const Shape shape{logits.size(0), a.i64("topk")};
  return {{"topk_weights", shape, DType::f32}, {"topk_ids", shape, DType::i32}};
}

// Reads the logits (and bias), writes weights and ids. Flops per logit: max, subtract, exp
// (counted as 1), sum; the selection's compares are not counted.
Cost routing_cost(const ArgList& a) {
  const TensorView& logits = a.tensor("gating_output");
  const double out = double(logits.size(0) * a.i64("topk")) * 8.0;
  return Cost{bytes_of(logits) + out, 4 * double(logits.numel())};
}

}  // namespace

void register_routing(Registry& reg) {
  const char* ref_summary = "plain loops, double softmax / sigmoid, k rounds of argmax";
  const char* cpu_summary = "Highway SIMD scores (f32) + OpenMP over token tasks, insertion top-k";
  OpEntry& topk = reg.add_op<TopkSoftmax>();
  topk.outputs = routing_outputs;
  topk.cost = routing_cost;
  topk.cases = topk_softmax_cases;
  reg.add_kernel<TopkSoftmax>(reference_kernel_desc(ref_summary), &topk_softmax_reference);
  reg.add_kernel<TopkSoftmax>(cpu_kernel_desc(cpu_summary), &topk_softmax_cpu,
                              &topk_softmax_cpu_applicable);

  OpEntry& grouped = reg.add_op<GroupedTopk>();
  grouped.outputs = routing_outputs;
  grouped.cost = routing_cost;
  grouped.cases = grouped_topk_cases;
  reg.add_kernel<GroupedTopk>(reference_kernel_desc(ref_summary), &grouped_topk_reference);
  reg.add_kernel<GroupedTopk>(cpu_kernel_desc(cpu_summary), &grouped_topk_cpu,
                              &grouped_topk_cpu_applicable);
  register_moe(reg);
}

}  // namespace opforge
