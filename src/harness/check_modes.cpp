// test and grad modes.
#include <cmath>
#include <string>

#include "harness/fuzz.h"
#include "harness/instance.h"
#include "opforge/error.h"
#include "opforge/harness.h"

namespace opforge::harness {

using namespace detail;

const char* status_name(Status s) {
  return s == Status::pass ? "pass" : s == Status::fail ? "FAIL" : "skip";
}

int Report::count(Status s) const {
  int n = 0;
  for (const Result& r : results) n += r.status == s;
  return n;
}

namespace {

// Compares one output with the truth: max |a-r| <= atol + rtol*|r| element-wise, plus NMSE.
// Fills r.max_abs_err / r.nmse; returns "" or what failed.
std::string compare(const std::string& name, const std::vector<double>& got,
                    const std::vector<bool>& poisoned, const std::vector<double>& want,
                    const Tolerance& tol, Result& r) {
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double a = got[i], w = want[i];
    if (!poisoned.empty() && poisoned[i])
      return name + "[" + std::to_string(i) + "] was not written (still holds the poison NaN)";
    if (std::isnan(w) || std::isnan(a)) {
      if (std::isnan(w) && std::isnan(a)) continue;
      return name + "[" + std::to_string(i) + "] = " + std::to_string(a) + ", reference " + std::to_string(w);
    }
    if (std::isinf(w) || std::isinf(a)) {
      if (a == w) continue;
      return name + "[" + std::to_string(i) + "] = " + std::to_string(a) + ", reference " + std::to_string(w);
    }
    double e = std::fabs(a - w);
    r.max_abs_err = std::max(r.max_abs_err, e);
    err2 += e * e;
    ref2 += w * w;
    if (e > tol.atol + tol.rtol * std::fabs(w))
      return name + "[" + std::to_string(i) + "] = " + std::to_string(a) + ", reference " + std::to_string(w) +
             ": |diff| " + std::to_string(e) + " > atol " + std::to_string(tol.atol) + " + rtol " +
             std::to_string(tol.rtol) + " * |ref|";
  }
  // Relative RMS error bound; errors up to atol per element are free (ill-conditioned tiny
  // outputs, e.g. the dx of a 1-element norm, are judged by atol alone).
  double nmse = ref2 > 0 ? err2 / ref2 : 0.0;
  r.nmse = std::max(r.nmse, nmse);
  if (err2 > tol.nmse * ref2 + double(want.size()) * tol.atol * tol.atol)
    return name + ": normalized MSE " + std::to_string(nmse) + " > " + std::to_string(tol.nmse);
  return "";
}

// What a kernel's outputs must equal: the reference run on the same inputs. For kernels other
// than the reference, the reference runs in the same dtype (so intermediate roundings the op's
// definition prescribes, like s = x + residual stored in bf16, are the same on both sides); the
// reference itself is compared with its own run in f64.
std::vector<std::vector<double>> expected(const Registry& reg, const OpEntry& op,
                                          const std::vector<ArgPlan>& plan,
                                          const std::vector<std::vector<double>>& masters, DType t) {
  const KernelEntry* ref = op.reference();
  if (!ref) throw Error(ErrorCode::internal, op.name + " has no reference kernel");
  PlainArgs a = make_plain(op, plan, masters, t, Device::cpu());
  reg.call(only(op, *ref, Device::cpu()), a.values);
  std::vector<std::vector<double>> out(plan.size());
  for (size_t i = 0; i < plan.size(); ++i)
    if (plan[i].is_output || op.args[i].role == ArgRole::inout) out[i] = tensor_values(a.tensors[i]);
  return out;
}

// Points outputs named in Case::in_place at their input's buffer.
void apply_in_place(const OpEntry& op, const Case& c, GuardedArgs& a) {
  for (const auto& [out, in] : c.in_place) {
    size_t o = op.arg_index(out), i = op.arg_index(in);
    a.buffers[o] = a.buffers[i];
    a.values[o] = a.buffers[i].view;
  }
}

bool is_in_place_input(const Case& c, const std::string& name) {
  for (const auto& pair : c.in_place)
    if (pair.second == name) return true;
  return false;
}

// A fuzz draw the reference rejected (Note [fuzz derivation]): the kernel must reject it too,
// with opforge::Error, before writing anything. Its own predicate saying "not applicable" is a
// rejection as well: the harness runs the kernel through a strict decision, where a predicate's
// refusal after Op::check throws.
Result check_rejected(const Registry& reg, const Options& opt, const OpEntry& op, const KernelEntry& k,
                      const Case& c, DType t, const std::vector<ArgPlan>& plan,
                      const std::vector<std::vector<double>>& masters, const std::string& why) {
  Device dev = device_for(opt, k);
  Result r{"test", op.name, k.impl(), dev.str(), dtype_name(t), c.label, case_group_name(c.group)};
  r.rejected = true;
  GuardedArgs a;
  try {
    a = make_guarded_args(op, plan, masters, t, dev);
  } catch (const Error&) {
    // The shape function refuses the draw as well: there are no outputs to hand a kernel.
    r.detail = std::string("rejected by the reference and the shape function: ") + why;
    return r;
  }
  if (!c.in_place.empty()) {
    if (!k.desc.properties.in_place) {
      r.status = Status::skip;
      r.detail = "in-place case; kernel does not declare in_place";
      return r;
    }
    apply_in_place(op, c, a);
  }
  try {
    reg.call(only(op, k, dev), a.values);
    if (const DeviceMemoryOps* ops = device_memory_ops(dev.kind); ops && !dev.is_cpu()) ops->synchronize(dev.index);
  } catch (const Error& e) {
    for (size_t i = 0; i < plan.size(); ++i) {
      if (!plan[i].is_tensor || !a.buffers[i].storage.defined()) continue;
      if (read_back(a.buffers[i]) != a.buffers[i].initial) {
        r.status = Status::fail;
        r.detail = "rejected the draw but wrote '" + op.args[i].name + "' first: " + e.what();
        return r;
      }
    }
    r.detail = std::string("rejected by the reference and the kernel: ") + e.what();
    return r;
  }
  // Note [device values]: the op's check reads the values of host tensors only (ids in range,
  // offsets in order); on a device that read would synchronize with the host, so device kernels
  // are documented to take such values unchecked (a NaN loss, a zero row, a skipped token) and
  // must still stay inside their buffers. The reference ran on the host and the kernel under
  // test passed the same check, so its acceptance on a device can only come from values: the
  // draw counts as rejected when every guard byte is intact and no input changed.
  if (!dev.is_cpu()) {
    for (size_t i = 0; i < plan.size(); ++i) {
      if (!plan[i].is_tensor || !a.buffers[i].storage.defined()) continue;
      const std::vector<uint8_t> after = read_back(a.buffers[i]);
      std::string bad = check_outside(a.buffers[i], after);
      const bool writes = plan[i].is_output || op.args[i].role == ArgRole::inout;
      if (bad.empty() && !writes && !is_in_place_input(c, op.args[i].name) && after != a.buffers[i].initial)
        bad = "input '" + op.args[i].name + "' was modified";
      if (!bad.empty()) {
        r.status = Status::fail;
        r.detail = "accepted a draw the reference rejects for its values and then " + bad + " (" + why + ")";
        return r;
      }
    }
    r.detail = "rejected by the reference for values a " + std::string(device_kind_name(dev.kind)) +
               " kernel does not check (Note [device values]), run within its buffers: " + why;
    return r;
  }
  r.status = Status::fail;
  r.detail = "accepted a draw the reference rejects (" + why + ")";
  return r;
}

// One checked run of kernel k on a case in dtype t. Returns the filled Result.
Result check_one(const Registry& reg, const Options& opt, const OpEntry& op, const KernelEntry& k,
                 const Case& c, DType t, const std::vector<ArgPlan>& plan) {
  Device dev = device_for(opt, k);
  Result r{"test", op.name, k.impl(), dev.str(), dtype_name(t), c.label, case_group_name(c.group)};
  auto masters = input_masters(op, c, plan, t, opt.seed);
  std::vector<std::vector<double>> want;
  try {
    want = expected(reg, op, plan, masters, k.is_reference() ? DType::f64 : t);
  } catch (const Error& e) {
    if (opt.fuzz <= 0) throw;  // a declared case the reference refuses is a harness error
    return check_rejected(reg, opt, op, k, c, t, plan, masters, e.what());
  }
  GuardedArgs a = make_guarded_args(op, plan, masters, t, dev);
  if (!c.in_place.empty()) {
    if (!k.desc.properties.in_place) {
      r.status = Status::skip;
      r.detail = "in-place case; kernel does not declare in_place";
      return r;
    }
    apply_in_place(op, c, a);
  }
  const char* why = k.boxed_predicate ? k.boxed_predicate(k.predicate, a.values) : nullptr;
  if (why) {
    r.status = Status::skip;
    r.detail = std::string("not applicable: ") + why;
    return r;
  }
  try {
    reg.call(only(op, k, dev), a.values);
    if (const DeviceMemoryOps* ops = device_memory_ops(dev.kind); ops && !dev.is_cpu()) ops->synchronize(dev.index);
  } catch (const Error& e) {
    r.status = Status::fail;
    r.detail = std::string("threw: ") + e.what();
    return r;
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].is_tensor || !a.buffers[i].storage.defined()) continue;
    const std::string& name = op.args[i].name;
    if (is_in_place_input(c, name)) continue;  // checked through the output that aliases it
    std::vector<uint8_t> after = read_back(a.buffers[i]);
    std::string bad = check_outside(a.buffers[i], after);
    bool writes = plan[i].is_output || op.args[i].role == ArgRole::inout;
    if (bad.empty() && !writes && after != a.buffers[i].initial) bad = "input '" + name + "' was modified";
    if (bad.empty() && writes) {
      std::vector<bool> poisoned;
      std::vector<double> got = element_values(a.buffers[i], after, &poisoned);
      bad = compare(name, got, poisoned, want[i], k.tolerance(a.buffers[i].view.dtype), r);
    }
    if (!bad.empty()) {
      r.status = Status::fail;
      r.detail = (bad.rfind("out-of-bounds", 0) == 0 ? name + ": " : "") + bad;
      return r;
    }
  }
  r.detail = "max|err| " + std::to_string(r.max_abs_err) + ", nmse " + std::to_string(r.nmse);
  return r;
}

Report check_ops(const Registry& reg, const Options& opt, bool backward_ops, const char* mode) {
  Report rep;
  rep.date = today_iso();
  rep.fuzz = opt.fuzz;
  rep.fuzz_seed = opt.fuzz_seed;
  struct Job { const OpEntry* op; const KernelEntry* k; Case c; DType t; };
  std::vector<Job> jobs;
  for (const OpEntry* op : reg.ops()) {
    if (!op_selected(opt, *op) || is_backward_op(reg, *op) != backward_ops || !op->cases) continue;
    // Fuzz: the draws replace the declared cases (fuzz_cases applies the group and label filters
    // to the cases it starts from).
    const std::vector<Case> cases = opt.fuzz > 0 ? fuzz_cases(opt, *op) : op->cases();
    for (const Case& c : cases) {
      if (opt.fuzz <= 0 && !case_selected(opt, c, false)) continue;
      for (const KernelEntry& k : op->kernels) {
        if (!backend_selected(reg, opt, k) || !k.availability().ok) continue;
        for (DType t : dtypes_for(opt, k, c, false)) jobs.push_back({op, &k, c, t});
      }
    }
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    progress(opt, j, jobs.size(), job.op->name + " " + job.k->impl() + " " + dtype_name(job.t) + " " + job.c.label);
    Result r;
    try {
      r = check_one(reg, opt, *job.op, *job.k, job.c, job.t, plan_case(*job.op, job.c));
    } catch (const std::exception& e) {
      r = Result{mode, job.op->name, job.k->impl(), device_kind_name(job.k->desc.device), dtype_name(job.t),
                 job.c.label, case_group_name(job.c.group), Status::fail, std::string("harness error: ") + e.what()};
    }
    r.mode = mode;
    rep.results.push_back(std::move(r));
  }
  progress(opt, jobs.size(), jobs.size(), "");
  return rep;
}

}  // namespace

Report run_test(const Registry& reg, const Options& opt) { return check_ops(reg, opt, false, "test"); }

// grad_fd.cpp
Report finite_difference_checks(const Registry& reg, const Options& opt);

Report run_grad(const Registry& reg, const Options& opt) {
  Report rep = finite_difference_checks(reg, opt);
  Report kernels = check_ops(reg, opt, true, "grad");
  rep.results.insert(rep.results.end(), kernels.results.begin(), kernels.results.end());
  return rep;
}

}  // namespace opforge::harness
