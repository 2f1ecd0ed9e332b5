// Registry::dump_table / dump_json: every op x kernel, availability and what the policy selects.
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "opforge/error.h"
#include "opforge/registry.h"

namespace opforge {

KernelEntry& Registry::add_unavailable(std::string_view name, KernelDesc desc, std::string reason) {
  OpEntry& e = const_cast<OpEntry&>(op(name));
  detail::check_new_kernel(e, desc);
  desc.probe = [reason] { return Availability{false, reason}; };
  KernelEntry& k = e.kernels.emplace_back();
  k.desc = std::move(desc);
  k.op = &e;
  return k;
}

namespace {

// The kernel the policy would pick first on each device kind (device 0), or null.
struct Selection {
  const KernelEntry* kernel = nullptr;
  bool staged = false;
  std::string why_none;
};

Selection select(const Registry& reg, const OpEntry& op, const Policy& policy, DeviceKind kind) {
  Selection s;
  try {
    Decision d = reg.decide(op, policy, Device{kind, 0});
    s.kernel = d.candidates.front().kernel;
    s.staged = d.candidates.front().host_staged;
  } catch (const Error& e) {
    s.why_none = e.what();
  }
  return s;
}

}  // namespace

std::string Registry::dump_table(const Policy& policy) const {
  policy.validate(*this);
  std::string out = fmt::format("policy: {}{}\n\n{:<30} {:<12} {:<6} {:<10} {}\n", policy.str(), policy.rules().empty() ? " (built-in default)" : "", "op", "impl",
                                "device", "selected", "availability");
  int optimized[2] = {0, 0}, reference[2] = {0, 0};
  for (const OpEntry* op : ops()) {
    Selection sel[2] = {select(*this, *op, policy, DeviceKind::cpu), select(*this, *op, policy, DeviceKind::cuda)};
    for (int d = 0; d < 2; ++d) {
      if (!sel[d].kernel) continue;
      (sel[d].kernel->is_reference() ? reference : optimized)[d]++;
    }
    for (const KernelEntry& k : op->kernels) {
      const Availability& a = k.availability();
      std::string selected;
      for (int d = 0; d < 2; ++d)
        if (sel[d].kernel == &k) selected += std::string(selected.empty() ? "" : ",") + (d == 0 ? "cpu" : "cuda") + (sel[d].staged ? "*" : "");
      out += fmt::format("{:<30} {:<12} {:<6} {:<10} {}\n", op->name, k.impl(), device_kind_name(k.desc.device),
                         selected.empty() ? "-" : selected, a.ok ? "available" : "unavailable: " + a.reason);
    }
  }
  out += fmt::format("\ncpu:  {} ops on optimized kernels, {} on reference\n", optimized[0], reference[0]);
  out += fmt::format("cuda: {} ops on optimized kernels, {} on reference\n", optimized[1], reference[1]);
  out += "(* = reference run on the host with copies to and from the device)\n";
  return out;
}

std::string Registry::dump_json(const Policy& policy) const {
  policy.validate(*this);
  nlohmann::json doc;
  doc["policy"] = policy.str();
  nlohmann::json ops_json = nlohmann::json::array();
  int counts[2][2] = {{0, 0}, {0, 0}};  // [device][optimized?]
  for (const OpEntry* op : ops()) {
    Selection sel[2] = {select(*this, *op, policy, DeviceKind::cpu), select(*this, *op, policy, DeviceKind::cuda)};
    nlohmann::json o;
    o["name"] = op->name;
    o["signature"] = op->signature;
    o["doc"] = op->doc;
    o["backward"] = op->backward;
    nlohmann::json kernels = nlohmann::json::array();
    for (const KernelEntry& k : op->kernels) {
      const Availability& a = k.availability();
      int d = int(k.desc.device);
      nlohmann::json kj{{"impl", k.impl()}, {"device", device_kind_name(k.desc.device)},
                        {"priority", k.desc.priority}, {"available", a.ok}, {"reason", a.reason},
                        {"selected", sel[d].kernel == &k}, {"summary", k.desc.summary},
                        {"deterministic", k.desc.properties.deterministic},
                        {"batch_invariant", k.desc.properties.batch_invariant},
                        {"in_place", k.desc.properties.in_place}};
      nlohmann::json dtypes = nlohmann::json::array();
      for (DType t : k.desc.dtypes) dtypes.push_back(dtype_name(t));
      kj["dtypes"] = dtypes;
      kernels.push_back(kj);
    }
    o["kernels"] = kernels;
    nlohmann::json selected;
    for (int d = 0; d < 2; ++d) {
      const char* dev = d == 0 ? "cpu" : "cuda";
      if (sel[d].kernel) {
        selected[dev] = sel[d].kernel->impl();
        counts[d][sel[d].kernel->is_reference() ? 0 : 1]++;
      } else {
        selected[dev] = nullptr;
      }
    }
    o["selected"] = selected;
    ops_json.push_back(o);
  }
  doc["ops"] = ops_json;
  doc["counts"] = {{"cpu", {{"optimized", counts[0][1]}, {"reference", counts[0][0]}}},
                   {"cuda", {{"optimized", counts[1][1]}, {"reference", counts[1][0]}}}};
  return doc.dump(2);
}

}  // namespace opforge
