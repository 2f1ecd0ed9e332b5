// Registry: ops, kernels, decisions and boxed calls.
#include "opforge/registry.h"

#include <algorithm>
#include <iostream>
#include <mutex>
#include <set>

#include "opforge/error.h"
#include "opforge/slot.h"

namespace opforge {

// ---- tolerances and kernel entries ------------------------------------------------------------
// Note [tolerances]: defaults for a kernel against the reference, per output dtype. bf16 has 8
// mantissa bits (2^-8 = 3.9e-3 relative step), f16 11 (4.9e-4); a kernel may differ from the
// reference by about one rounding of the output plus f32 accumulation-order noise.
Tolerance default_tolerance(DType t) {
  switch (t) {
    case DType::f64: return {1e-10, 1e-10, 1e-20};
    case DType::f32: return {1e-5, 1e-5, 1e-10};
    case DType::f16: return {2e-3, 2e-3, 1e-6};
    case DType::bf16: return {1.6e-2, 1.6e-2, 5e-5};
    default: return {0, 0, 0};  // integers: exact
  }
}

KernelDesc reference_kernel_desc(std::string summary, bool in_place) {
  KernelDesc d{"reference", DeviceKind::cpu, kReferencePriority, std::move(summary)};
  d.properties.in_place = in_place;
  d.dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16};
  return d;
}

KernelDesc cpu_kernel_desc(std::string summary, bool in_place) {
  KernelDesc d{"cpu", DeviceKind::cpu, kCpuPriority, std::move(summary)};
  d.properties.in_place = in_place;
  d.dtypes = {DType::f32, DType::f16, DType::bf16};
  return d;
}

bool KernelEntry::claims(DType t) const {
  return std::find(desc.dtypes.begin(), desc.dtypes.end(), t) != desc.dtypes.end();
}

Tolerance KernelEntry::tolerance(DType t) const {
  auto it = desc.tolerances.find(t);
  return it != desc.tolerances.end() ? it->second : default_tolerance(t);
}

const Availability& KernelEntry::availability() const {
  std::call_once(probed_, [this] {
    if (desc.probe) {
      try {
        availability_ = desc.probe();
      } catch (const std::exception& e) {
        availability_ = {false, std::string("probe failed: ") + e.what()};
      }
    }
    if (!fn && availability_.ok) availability_ = {false, "no kernel function (placeholder)"};
  });
  return availability_;
}

const KernelEntry* OpEntry::kernel(std::string_view impl, DeviceKind device) const {
  for (const KernelEntry& k : kernels)
    if (k.desc.impl == impl && k.desc.device == device) return &k;
  return nullptr;
}

const KernelEntry* OpEntry::reference() const { return kernel("reference", DeviceKind::cpu); }

std::vector<std::string> OpEntry::impl_names() const {
  std::vector<std::string> names;
  for (const KernelEntry& k : kernels)
    if (std::find(names.begin(), names.end(), k.desc.impl) == names.end()) names.push_back(k.desc.impl);
  return names;
}

size_t OpEntry::arg_index(std::string_view n) const {
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name == n) return i;
  std::string valid;
  for (const ArgInfo& a : args) valid += (valid.empty() ? "" : ", ") + a.name;
  throw Error(ErrorCode::unknown_name,
              name + ": no argument named '" + std::string(n) + "'; arguments: " + valid);
}

namespace detail {

std::string format_signature(const OpEntry& op) {
  std::string s = op.name + "(";
  for (size_t i = 0; i < op.args.size(); ++i) {
    const ArgInfo& a = op.args[i];
    if (i) s += ", ";
    if (a.role == ArgRole::out) s += "out ";
    if (a.role == ArgRole::inout) s += "inout ";
    if (a.role == ArgRole::opt_in) s += "optional ";
    s += std::string(a.type == ArgType::tensor ? "Tensor" : arg_type_name(a.type)) + " " + a.name;
    if (a.has_default) s += "=" + a.default_value;
  }
  return s + ")";
}

void finish_op(OpEntry& op) {
  for (const ArgInfo& a : op.args) {
    bool tensor_role = a.role != ArgRole::scalar;
    if (tensor_role != (a.type == ArgType::tensor))
      throw Error(ErrorCode::internal, op.name + ": argument '" + a.name + "' has role " +
                                           arg_role_name(a.role) + " but type " + arg_type_name(a.type));
  }
  op.signature = format_signature(op);
}

void check_new_kernel(const OpEntry& op, const KernelDesc& desc) {
  if (op.kernel(desc.impl, desc.device))
    throw Error(ErrorCode::internal, op.name + ": kernel '" + desc.impl + "' for " +
                                         device_kind_name(desc.device) + " registered twice");
}

}  // namespace detail

// ---- registry --------------------------------------------------------------------------------
OpEntry& Registry::new_op(std::string name) {
  if (ops_.count(name)) throw Error(ErrorCode::internal, "op '" + name + "' registered twice");
  auto entry = std::make_unique<OpEntry>();
  entry->name = name;
  OpEntry& ref = *entry;
  ops_.emplace(std::move(name), std::move(entry));
  return ref;
}

const OpEntry* Registry::find(std::string_view name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

std::vector<std::string> Registry::op_names() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : ops_) names.push_back(name);
  return names;
}

const OpEntry& Registry::op(std::string_view name) const {
  if (const OpEntry* e = find(name)) return *e;
  std::string valid;
  for (const std::string& n : op_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw Error(ErrorCode::unknown_name, "unknown op '" + std::string(name) + "'; valid ops: " + valid);
}

std::vector<const OpEntry*> Registry::ops() const {
  std::vector<const OpEntry*> v;
  for (const auto& [_, e] : ops_) v.push_back(e.get());
  return v;
}

Registry& global_registry() {
  static Registry* registry = [] {
    auto* r = new Registry();  // never destroyed: slots and kernels may outlive static destructors
    register_all(*r);
    return r;
  }();
  return *registry;
}

// ---- warnings --------------------------------------------------------------------------------
static std::mutex g_warn_mutex;
static std::function<void(const std::string&)> g_warning_handler;

void set_warning_handler(std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(g_warn_mutex);
  g_warning_handler = std::move(handler);
}

void warn_once(const std::string& key, const std::string& message) {
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(g_warn_mutex);
  if (!seen.insert(key).second) return;
  if (g_warning_handler) g_warning_handler(message);
  else std::cerr << "opforge: warning: " << message << "\n";
}

}  // namespace opforge
