// Turning a Case into argument values for one kernel, dtype and device.
#pragma once

#include <string>
#include <vector>

#include "harness/materialize.h"
#include "opforge/harness.h"
#include "opforge/registry.h"

namespace opforge::harness::detail {

// What the case says for each argument of the op, in signature order.
struct ArgPlan {
  bool is_tensor = false;
  bool is_output = false;     // out: allocated from the shape function
  bool present = true;        // false: an optional tensor the case leaves out (None)
  TensorInit init;            // inputs; for outputs only row_pad is used
  Value scalar;               // scalars (the case's value or the default)
};
std::vector<ArgPlan> plan_case(const OpEntry& op, const Case& c);

// Input master values per argument (empty for non-inputs), rounded to the dtype each input has
// when the case runs in `dtype`.
std::vector<std::vector<double>> input_masters(const OpEntry& op, const Case& c,
                                               const std::vector<ArgPlan>& plan, DType dtype,
                                               uint64_t seed);
DType input_dtype(const ArgPlan& p, DType dtype);

// Plain contiguous arguments (truth in f64 on the CPU, and perf). Outputs are allocated from the
// shape function and hold zeros.
struct PlainArgs {
  std::vector<Tensor> tensors;  // by argument index
  std::vector<Value> values;
};
PlainArgs make_plain(const OpEntry& op, const std::vector<ArgPlan>& plan,
                     const std::vector<std::vector<double>>& masters, DType dtype, Device device);
// The same for perf mode, inputs filled in parallel straight into their dtype (Note [perf inputs]).
PlainArgs make_perf_args(const OpEntry& op, const Case& c, const std::vector<ArgPlan>& plan, DType dtype,
                         Device device, uint64_t seed);

// Guarded arguments for a checked run (Note [poison and guards]).
struct GuardedArgs {
  std::vector<Guarded> buffers;  // by argument index; storage undefined for non-tensors
  std::vector<Value> values;
};
GuardedArgs make_guarded_args(const OpEntry& op, const std::vector<ArgPlan>& plan,
                              const std::vector<std::vector<double>>& masters, DType dtype,
                              Device device);

// Output specs of the shape function for these values (outputs None while evaluated).
std::vector<OutputSpec> output_specs(const OpEntry& op, std::vector<Value> values);

// A decision that runs exactly one kernel (strict), for the harness.
Decision only(const OpEntry& op, const KernelEntry& k, Device device);

// Kernel filter of Options::backends.
bool backend_selected(const Registry& reg, const Options& opt, const KernelEntry& k);
// The shard (0 .. shard_count - 1) an op belongs to under Options::shard_count.
int op_shard(const std::string& name, int shard_count);
bool op_selected(const Options& opt, const OpEntry& op);
bool group_selected(const Options& opt, CaseGroup g, bool perf);
// A case runs when its label is among Options::cases, or, with no labels given, its group is selected.
bool case_selected(const Options& opt, const Case& c, bool perf);
std::vector<DType> dtypes_for(const Options& opt, const KernelEntry& k, const Case& c, bool perf);
Device device_for(const Options& opt, const KernelEntry& k);
// Ops that are some op's backward (grad mode covers them; test mode the others).
bool is_backward_op(const Registry& reg, const OpEntry& op);

// Progress line on stderr when enabled.
void progress(const Options& opt, size_t done, size_t total, const std::string& what);
std::string today_iso();

}  // namespace opforge::harness::detail
