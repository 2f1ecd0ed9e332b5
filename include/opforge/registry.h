// Registry: ops and their kernels; decisions; boxed calls; dump.
//
// Registration is explicit: each op family has `void register_<family>(Registry&)`, and
// register_all() (src/registry/register_all.cpp) lists the families. The process-wide registry
// is global_registry().
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "opforge/op.h"
#include "opforge/error.h"
#include "opforge/policy.h"

namespace opforge {

struct Tolerance {
  double atol = 0;
  double rtol = 0;
  double nmse = 0;  // bound on sum((a-r)^2) / max(sum(r^2), tiny)
};
// Defaults by dtype for a kernel compared with the reference (Note [tolerances] in docs/design.md).
Tolerance default_tolerance(DType t);

struct KernelProperties {
  bool deterministic = true;    // same inputs -> same bits, run after run
  bool batch_invariant = true;  // a row's result does not depend on the other rows
  bool in_place = false;        // accepts outputs that alias inputs exactly
};

struct Availability {
  bool ok = true;
  std::string reason;  // why not, when !ok
};

// What a kernel says about itself when registered.
struct KernelDesc {
  std::string impl;  // "reference", "cpu", "cuda", "cuda_vec16", plug-in names
  DeviceKind device = DeviceKind::cpu;
  int priority = 0;  // higher first; reference kernels use kReferencePriority
  std::string summary;
  KernelProperties properties{};
  std::vector<DType> dtypes;  // floating dtypes claimed; the harness tests each
  std::map<DType, Tolerance> tolerances;  // overrides of default_tolerance
  std::function<Availability()> probe;    // null: always available
};
inline constexpr int kReferencePriority = -1000;
inline constexpr int kCpuPriority = 100;

// The descriptions every family shares: a reference kernel (every floating dtype, f64 included,
// so the harness can evaluate the truth in f64) and an optimized CPU kernel (f32, f16, bf16).
KernelDesc reference_kernel_desc(std::string summary, bool in_place = false);
KernelDesc cpu_kernel_desc(std::string summary, bool in_place = false);

struct OpEntry;

// Type-erased function pointer; cast back to OpTraits<Op>::Kernel* / ::Predicate* (function
// pointer round trips through another function pointer type are exact).
using AnyFn = void (*)();
using BoxedKernel = void (*)(AnyFn fn, const Context&, std::span<const Value>);
using BoxedPredicate = const char* (*)(AnyFn pred, std::span<const Value>);

struct KernelEntry {
  KernelDesc desc;
  const OpEntry* op = nullptr;
  AnyFn fn = nullptr;         // OpTraits<Op>::Kernel*, type-erased
  AnyFn predicate = nullptr;  // OpTraits<Op>::Predicate* or null
  BoxedKernel boxed = nullptr;
  BoxedPredicate boxed_predicate = nullptr;

  const std::string& impl() const { return desc.impl; }
  bool is_reference() const { return desc.impl == "reference"; }
  bool claims(DType t) const;
  Tolerance tolerance(DType t) const;
  // Runs the probe once and caches the answer.
  const Availability& availability() const;

 private:
  mutable std::once_flag probed_;
  mutable Availability availability_;
};

struct OpEntry {
  std::string name;
  std::string doc;
  std::string signature;  // "rms_norm(out Tensor y, Tensor x, Tensor w, float eps, float offset=0)"
  std::vector<ArgInfo> args;
  std::string backward;  // name of the backward op, or empty
  std::deque<KernelEntry> kernels;  // deque: entries never move once registered

  // Boxed hooks generated from the typed op.
  void (*check_boxed)(std::span<const Value>) = nullptr;
  // Shape function (may be null for ops without outputs). Cost model and cases.
  std::function<std::vector<OutputSpec>(const ArgList&)> outputs;
  std::function<Cost(const ArgList&)> cost;
  std::function<std::vector<Case>()> cases;

  const KernelEntry* kernel(std::string_view impl, DeviceKind device) const;
  const KernelEntry* reference() const;
  std::vector<std::string> impl_names() const;
  size_t arg_index(std::string_view name) const;  // Error naming valid args when unknown
};

// The outcome of ranking an op's kernels for one device under a policy.
struct Candidate {
  const KernelEntry* kernel;
  bool forced = false;
  bool host_staged = false;  // a CPU reference serving another device by copying through the host
};
struct Decision {
  const OpEntry* op = nullptr;
  Device device{};
  PolicyMode mode = PolicyMode::fallback;
  std::vector<Candidate> candidates;  // in order of preference; never empty after decide()
  std::vector<std::string> trace;     // human-readable reasons, one line each
  std::string rule_text;              // e.g. "rms_norm=cpu (from OPFORGE_OPS)"
  std::string explain() const;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  template <class Op> OpEntry& add_op();
  template <class Op, class F>
  KernelEntry& add_kernel(KernelDesc desc, F* fn,
                          typename OpTraits<Op>::Predicate* predicate = nullptr);

  // An entry that can never run, listed with its reason (a backend left out of this build).
  KernelEntry& add_unavailable(std::string_view op, KernelDesc desc, std::string reason);

  const OpEntry* find(std::string_view name) const;
  const OpEntry& op(std::string_view name) const;  // Error(unknown_name) listing valid names
  std::vector<const OpEntry*> ops() const;         // sorted by name
  std::vector<std::string> op_names() const;

  Decision decide(const OpEntry& op, const Policy& policy, Device device) const;
  // Boxed call: checks arity and types, runs the op's check, then the first applicable candidate.
  // Returns the kernel that ran.
  const KernelEntry& call(const Decision& decision, std::span<const Value> args,
                          Stream stream = {}) const;
  const KernelEntry& call(std::string_view op, std::span<const Value> args,
                          const Policy& policy = {}) const;

  // Every op x kernel with availability, selection under `policy` per device, as text or JSON.
  std::string dump_table(const Policy& policy) const;
  std::string dump_json(const Policy& policy) const;

 private:
  OpEntry& new_op(std::string name);
  std::map<std::string, std::unique_ptr<OpEntry>, std::less<>> ops_;
};

Registry& global_registry();       // the process-wide registry, filled by register_all() once
void register_all(Registry& reg);  // lists every op family (src/registry/register_all.cpp)

// Where warnings go (fallback notices). Default: stderr, one line each.
void set_warning_handler(std::function<void(const std::string&)> handler);
void warn_once(const std::string& key, const std::string& message);

}  // namespace opforge

#include "opforge/detail/registry_impl.h"
