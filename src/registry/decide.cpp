// Ranking an op's kernels for a device under a policy, and running the choice (typed slots share
// the slow paths here with the boxed call).
#include <algorithm>
#include <string>

#include "opforge/error.h"
#include "opforge/registry.h"
#include "opforge/slot.h"

namespace opforge {

namespace {

std::string rule_origin(const PolicyRule* r) {
  if (!r) return "all (built-in default)";
  return "'" + r->text + "' (from " + r->source + ")";
}

// Available kernels of the device kind, best first; reference kernels excluded.
std::vector<const KernelEntry*> ranked_optimized(const OpEntry& op, DeviceKind kind,
                                                 std::vector<std::string>& trace) {
  std::vector<const KernelEntry*> ranked;
  for (const KernelEntry& k : op.kernels) {
    if (k.desc.device != kind || k.is_reference()) continue;
    const Availability& a = k.availability();
    if (!a.ok) {
      trace.push_back(k.impl() + ": unavailable: " + a.reason);
      continue;
    }
    ranked.push_back(&k);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const KernelEntry* a, const KernelEntry* b) {
    return a->desc.priority > b->desc.priority;
  });
  return ranked;
}

// Whether the reference (a CPU kernel) can serve this device: directly on the CPU, or through
// host staging on a device that some available kernel proves usable.
bool reference_usable(const OpEntry& op, Device device, bool& staged) {
  staged = !device.is_cpu();
  if (!staged) return true;
  if (!device_memory_ops(device.kind)) return false;
  for (const KernelEntry& k : op.kernels)
    if (k.desc.device == device.kind && k.availability().ok) return true;
  return false;
}

void add_unique(Decision& d, const KernelEntry* k, bool forced, bool staged) {
  for (const Candidate& c : d.candidates)
    if (c.kernel == k) return;
  d.candidates.push_back({k, forced, staged});
}

}  // namespace

Decision Registry::decide(const OpEntry& op, const Policy& policy, Device device) const {
  Decision d;
  d.op = &op;
  d.device = device;
  OpRuling r = policy.ruling(op.name);
  d.mode = r.mode;
  d.rule_text = rule_origin(r.rule);
  d.trace.push_back("rule: " + d.rule_text);
  d.trace.push_back("mode: " + std::string(r.mode == PolicyMode::strict ? "strict" : "fallback") +
                    (r.mode_rule ? " (from " + r.mode_rule->source + ")" : " (built-in default)"));
  std::vector<const KernelEntry*> ranked = ranked_optimized(op, device.kind, d.trace);
  const KernelEntry* ref = op.reference();
  bool staged = false;
  bool ref_ok = ref && reference_usable(op, device, staged);

  if (!r.forced.empty()) {
    for (const std::string& impl : r.forced) {
      const KernelEntry* k = op.kernel(impl, device.kind);
      bool k_staged = false;
      if (!k && impl == "reference" && ref_ok) { k = ref; k_staged = staged; }
      std::string why = !k ? "no '" + impl + "' kernel for " + device_kind_name(device.kind)
                        : !k->availability().ok ? impl + " unavailable: " + k->availability().reason
                                                : "";
      if (why.empty()) { add_unique(d, k, true, k_staged); continue; }
      if (r.mode == PolicyMode::strict)
        throw Error(ErrorCode::not_available, op.name + " on " + device.str() + ": forced kernel cannot run (" +
                                                  why + "); rule " + d.rule_text + ", mode strict");
      d.trace.push_back("forced " + why + "; falling back");
    }
    if (r.mode == PolicyMode::fallback) {
      for (const KernelEntry* k : ranked) add_unique(d, k, false, false);
      if (ref_ok) add_unique(d, ref, false, staged);
    }
  } else if (r.optimized) {
    for (const KernelEntry* k : ranked) add_unique(d, k, false, false);
    if (ref_ok) add_unique(d, ref, false, staged);
  } else {
    d.trace.push_back("optimized kernels off for this op: reference only");
    if (ref_ok) add_unique(d, ref, false, staged);
  }
  if (d.candidates.empty())
    throw Error(ErrorCode::not_available, op.name + ": no kernel can run on " + device.str() + " (rule " +
                                              d.rule_text + ")" +
                                              (d.trace.size() > 2 ? "; " + d.trace.back() : ""));
  std::string order;
  for (const Candidate& c : d.candidates)
    order += (order.empty() ? "" : " > ") + c.kernel->impl() + (c.host_staged ? " (host-staged)" : "");
  d.trace.push_back("candidates: " + order);
  return d;
}

std::string Decision::explain() const {
  std::string s = op->name + " on " + device.str() + ": ";
  const Candidate& first = candidates.front();
  s += first.kernel->impl() + " chosen unless its predicate rejects the arguments\n";
  for (const std::string& line : trace) s += "  " + line + "\n";
  for (const Candidate& c : candidates) {
    s += "  " + c.kernel->impl() + ": priority " + std::to_string(c.kernel->desc.priority);
    if (c.forced) s += ", forced";
    if (c.host_staged) s += ", runs on the host with copies to and from " + device.str();
    if (c.kernel->predicate) s += ", checks applicability per call";
    if (!c.kernel->desc.summary.empty()) s += " — " + c.kernel->desc.summary;
    s += "\n";
  }
  return s;
}

namespace detail {

void throw_wrong_device(const OpEntry& op, size_t arg, const TensorView& t, Device expected) {
  throw_argument_error(op.name, op.args[arg].name, "a tensor on " + expected.str() + " (the slot's device)",
                       t.device.str());
}

void throw_no_candidate(const Decision& d, const std::string& reasons) {
  throw Error(ErrorCode::not_available, d.op->name + " on " + d.device.str() +
                                            ": no candidate accepts these arguments (" + reasons +
                                            "); rule " + d.rule_text +
                                            (d.mode == PolicyMode::strict ? ", mode strict" : ""));
}

void note_fallback(const Decision& d, const KernelEntry& rejected, const char* why) {
  warn_once(d.op->name + "/" + rejected.impl() + "/" + why,
            d.op->name + ": " + rejected.impl() + " cannot run these arguments (" + why +
                "); using the next candidate");
}

void run_host_staged(const KernelEntry& k, const Context& ctx, std::span<const Value> args) {
  const OpEntry& op = *k.op;
  std::vector<Tensor> host(args.size());
  std::vector<Value> staged(args.begin(), args.end());
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* t = std::get_if<TensorView>(&args[i]);
    if (!t || t->device.is_cpu()) continue;
    host[i] = Tensor::copy_of(*t, Device::cpu(), t->dtype);
    staged[i] = host[i].view();
  }
  k.boxed(k.fn, Context{Device::cpu(), {}}, staged);
  for (size_t i = 0; i < args.size(); ++i) {
    ArgRole role = op.args[i].role;
    if (host[i].defined() && (role == ArgRole::out || role == ArgRole::inout))
      copy_into(std::get<TensorView>(args[i]), host[i].view());
  }
  (void)ctx;
}

}  // namespace detail

// ---- boxed calls -----------------------------------------------------------------------------
static void check_boxed_types(const OpEntry& op, std::span<const Value> args) {
  if (args.size() != op.args.size()) {
    std::string names;
    for (const ArgInfo& a : op.args) names += (names.empty() ? "" : ", ") + a.name;
    throw Error(ErrorCode::invalid_argument, op.name + ": expected " + std::to_string(op.args.size()) +
                                                 " arguments (" + names + "), got " +
                                                 std::to_string(args.size()));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgInfo& a = op.args[i];
    const Value& v = args[i];
    bool ok = false;
    switch (a.type) {
      case ArgType::tensor:
        ok = std::holds_alternative<TensorView>(v) ||
             (a.role == ArgRole::opt_in && std::holds_alternative<None>(v));
        if (ok && std::holds_alternative<TensorView>(v) && !std::get<TensorView>(v).defined())
          ok = a.role == ArgRole::opt_in;
        break;
      case ArgType::i64: ok = std::holds_alternative<int64_t>(v); break;
      case ArgType::f64: ok = std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v); break;
      case ArgType::boolean: ok = std::holds_alternative<bool>(v); break;
      case ArgType::string: ok = std::holds_alternative<std::string>(v); break;
    }
    if (!ok)
      throw_argument_error(op.name, a.name,
                           a.role == ArgRole::opt_in ? "a tensor or none" : arg_type_name(a.type),
                           value_type_name(v));
  }
}

const KernelEntry& Registry::call(const Decision& d, std::span<const Value> args, Stream stream) const {
  const OpEntry& op = *d.op;
  check_boxed_types(op, args);
  op.check_boxed(args);
  for (size_t i = 0; i < args.size(); ++i)
    if (const auto* t = std::get_if<TensorView>(&args[i]); t && t->defined() && !(t->device == d.device))
      detail::throw_wrong_device(op, i, *t, d.device);
  std::string reasons;
  for (const Candidate& c : d.candidates) {
    const KernelEntry& k = *c.kernel;
    const char* why = k.boxed_predicate ? k.boxed_predicate(k.predicate, args) : nullptr;
    if (why) {
      if (d.mode == PolicyMode::strict && c.forced) detail::throw_no_candidate(d, k.impl() + ": " + why);
      detail::note_fallback(d, k, why);
      reasons += k.impl() + ": " + why + "; ";
      continue;
    }
    Context ctx{d.device, stream};
    if (c.host_staged) detail::run_host_staged(k, ctx, args);
    else k.boxed(k.fn, ctx, args);
    return k;
  }
  detail::throw_no_candidate(d, reasons);
}

const KernelEntry& Registry::call(std::string_view name, std::span<const Value> args,
                                  const Policy& policy) const {
  const OpEntry& e = op(name);
  policy.validate(*this);
  Device device = Device::cpu();
  for (const Value& v : args)
    if (const auto* t = std::get_if<TensorView>(&v); t && t->defined()) { device = t->device; break; }
  return call(decide(e, policy, device), args);
}

// ---- default policy --------------------------------------------------------------------------
namespace {
std::mutex g_default_mutex;
std::atomic<uint64_t> g_generation{1};
bool g_have_default = false;
Policy g_default;
}  // namespace

std::mutex& detail::default_slot_mutex() {
  static std::mutex m;
  return m;
}

void set_default_policy(const Policy& policy) {
  policy.validate(global_registry());
  std::lock_guard<std::mutex> lock(g_default_mutex);
  g_default = policy;
  g_have_default = true;
  g_generation.fetch_add(1, std::memory_order_acq_rel);
}

Policy default_policy() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  if (!g_have_default) {
    g_default = Policy::from_sources();
    g_have_default = true;
  }
  return g_default;
}

uint64_t default_policy_generation() { return g_generation.load(std::memory_order_acquire); }

}  // namespace opforge
