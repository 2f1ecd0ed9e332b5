#include "harness/instance.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "opforge/error.h"

namespace opforge::harness::detail {

std::vector<ArgPlan> plan_case(const OpEntry& op, const Case& c) {
  std::vector<ArgPlan> plan(op.args.size());
  std::vector<bool> given(op.args.size(), false);
  for (const CaseArg& a : c.args) {
    size_t i = op.arg_index(a.name);
    given[i] = true;
    if (const auto* t = std::get_if<TensorInit>(&a.init)) plan[i].init = *t;
    else plan[i].scalar = std::get<Value>(a.init);
  }
  for (size_t i = 0; i < op.args.size(); ++i) {
    const ArgInfo& info = op.args[i];
    ArgPlan& p = plan[i];
    p.is_tensor = info.type == ArgType::tensor;
    p.is_output = info.role == ArgRole::out;
    if (info.role == ArgRole::opt_in && !given[i]) p.present = false;
    if (p.is_tensor || given[i]) continue;
    if (!info.has_default)
      throw Error(ErrorCode::internal, op.name + ": case '" + c.label + "' gives no value for '" + info.name + "'");
    p.scalar = parse_scalar_literal(op.name, info, info.default_value);
  }
  for (size_t i = 0; i < op.args.size(); ++i)
    if (plan[i].is_tensor && !plan[i].is_output && plan[i].present && !given[i])
      throw Error(ErrorCode::internal, op.name + ": case '" + c.label + "' gives no tensor '" + op.args[i].name + "'");
  return plan;
}

DType input_dtype(const ArgPlan& p, DType dtype) { return p.init.fixed_dtype ? p.init.dtype : dtype; }

std::vector<std::vector<double>> input_masters(const OpEntry& op, const Case& c,
                                               const std::vector<ArgPlan>& plan, DType dtype,
                                               uint64_t seed) {
  std::vector<std::vector<double>> m(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const ArgPlan& p = plan[i];
    if (!p.is_tensor || p.is_output || !p.present) continue;
    // The seed does not depend on dtype: every dtype sees the same numbers before rounding.
    Rng rng(mix_seed(seed, op.name, c.label, op.args[i].name));
    m[i] = generate(p.init, input_dtype(p, dtype), rng);
  }
  return m;
}

std::vector<OutputSpec> output_specs(const OpEntry& op, std::vector<Value> values) {
  if (!op.outputs) return {};
  for (size_t i = 0; i < op.args.size(); ++i)
    if (op.args[i].role == ArgRole::out) values[i] = None{};
  return op.outputs(ArgList(op.name, op.args, values));
}

static const OutputSpec& spec_for(const OpEntry& op, const std::vector<OutputSpec>& specs, size_t i) {
  for (const OutputSpec& s : specs)
    if (s.name == op.args[i].name) return s;
  throw Error(ErrorCode::internal, op.name + ": the shape function gives no output '" + op.args[i].name + "'");
}

// Outputs of plain arguments: allocated from the shape function, zeros.
static void add_plain_outputs(const OpEntry& op, const std::vector<ArgPlan>& plan, Device device, PlainArgs& a) {
  std::vector<OutputSpec> specs = output_specs(op, a.values);
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].is_output) continue;
    const OutputSpec& s = spec_for(op, specs, i);
    a.tensors[i] = Tensor::zeros(s.shape, s.dtype, device);
    a.values[i] = a.tensors[i].view();
  }
}

PlainArgs make_plain(const OpEntry& op, const std::vector<ArgPlan>& plan,
                     const std::vector<std::vector<double>>& masters, DType dtype, Device device) {
  PlainArgs a;
  a.tensors.resize(plan.size());
  a.values.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const ArgPlan& p = plan[i];
    if (!p.is_tensor) { a.values[i] = p.scalar; continue; }
    if (p.is_output || !p.present) { a.values[i] = None{}; continue; }
    a.tensors[i] = make_tensor(p.init.shape, input_dtype(p, dtype), device, masters[i]);
    a.values[i] = a.tensors[i].view();
  }
  add_plain_outputs(op, plan, device, a);
  return a;
}

PlainArgs make_perf_args(const OpEntry& op, const Case& c, const std::vector<ArgPlan>& plan, DType dtype,
                         Device device, uint64_t seed) {
  PlainArgs a;
  a.tensors.resize(plan.size());
  a.values.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const ArgPlan& p = plan[i];
    if (!p.is_tensor) { a.values[i] = p.scalar; continue; }
    if (p.is_output || !p.present) { a.values[i] = None{}; continue; }
    const DType t = input_dtype(p, dtype);
    Tensor host = Tensor::empty(p.init.shape, t, Device::cpu());
    fill_for_perf(host.data(), p.init, t, mix_seed(seed, op.name, c.label, op.args[i].name));
    a.tensors[i] = device.is_cpu() ? std::move(host) : Tensor::copy_of(host.view(), device, t);
    a.values[i] = a.tensors[i].view();
  }
  add_plain_outputs(op, plan, device, a);
  return a;
}

GuardedArgs make_guarded_args(const OpEntry& op, const std::vector<ArgPlan>& plan,
                              const std::vector<std::vector<double>>& masters, DType dtype,
                              Device device) {
  GuardedArgs a;
  a.buffers.resize(plan.size());
  a.values.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const ArgPlan& p = plan[i];
    if (!p.is_tensor) { a.values[i] = p.scalar; continue; }
    if (p.is_output || !p.present) { a.values[i] = None{}; continue; }
    a.buffers[i] = make_guarded(p.init.shape, input_dtype(p, dtype), p.init.row_pad, device, &masters[i]);
    a.values[i] = a.buffers[i].view;
  }
  std::vector<OutputSpec> specs = output_specs(op, a.values);
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].is_output) continue;
    const OutputSpec& s = spec_for(op, specs, i);
    a.buffers[i] = make_guarded(s.shape, s.dtype, plan[i].init.row_pad, device, nullptr);
    a.values[i] = a.buffers[i].view;
  }
  return a;
}

Decision only(const OpEntry& op, const KernelEntry& k, Device device) {
  Decision d;
  d.op = &op;
  d.device = device;
  d.mode = PolicyMode::strict;
  d.candidates.push_back({&k, true, false});
  d.rule_text = "harness: " + k.impl() + " only";
  return d;
}

static bool policy_allows(const Registry& reg, const Options& opt, const KernelEntry& k) {
  try {
    Decision d = reg.decide(*k.op, opt.policy, device_for(opt, k));
    for (const Candidate& c : d.candidates)
      if (c.kernel == &k) return true;
  } catch (const Error&) {
  }
  return false;
}

bool backend_selected(const Registry& reg, const Options& opt, const KernelEntry& k) {
  // The reference is the oracle: checked on the CPU whatever the policy says.
  if (!(k.is_reference() && k.desc.device == DeviceKind::cpu) && !policy_allows(reg, opt, k)) return false;
  if (opt.backends.empty()) return true;
  for (const std::string& b : opt.backends) {
    if (b == k.impl()) return true;
    if ((b == "cpu" || b == "cuda") && b == device_kind_name(k.desc.device) && !k.is_reference()) return true;
  }
  return false;
}

int op_shard(const std::string& name, int shard_count) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a, 64-bit
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return static_cast<int>(h % static_cast<uint64_t>(shard_count));
}

bool op_selected(const Options& opt, const OpEntry& op) {
  if (opt.shard_count > 1 && op_shard(op.name, opt.shard_count) != opt.shard_index) return false;
  return opt.ops.empty() || std::find(opt.ops.begin(), opt.ops.end(), op.name) != opt.ops.end();
}

bool group_selected(const Options& opt, CaseGroup g, bool perf) {
  if (!opt.groups.empty()) return std::find(opt.groups.begin(), opt.groups.end(), g) != opt.groups.end();
  if (g == CaseGroup::training) return false;  // only when asked for
  return perf ? g != CaseGroup::edge : g != CaseGroup::large;
}

bool case_selected(const Options& opt, const Case& c, bool perf) {
  if (!opt.cases.empty()) return std::find(opt.cases.begin(), opt.cases.end(), c.label) != opt.cases.end();
  return group_selected(opt, c.group, perf);
}

std::vector<DType> dtypes_for(const Options& opt, const KernelEntry& k, const Case& c, bool perf) {
  std::vector<DType> out;
  for (DType t : k.desc.dtypes) {
    // The reference is checked against its own f64 run in f32 and f64; in f16/bf16 it is the
    // definition other kernels are compared with (see expected() in check_modes.cpp).
    if (!perf && k.is_reference() && t != DType::f32 && t != DType::f64) continue;
    if (!c.dtypes.empty() && std::find(c.dtypes.begin(), c.dtypes.end(), t) == c.dtypes.end()) continue;
    if (!opt.dtypes.empty() && std::find(opt.dtypes.begin(), opt.dtypes.end(), t) == opt.dtypes.end()) continue;
    out.push_back(t);
  }
  // perf without --dtype: bf16 where claimed (the dtype models run in), else the first claimed.
  if (perf && opt.dtypes.empty() && !out.empty()) {
    auto bf = std::find(out.begin(), out.end(), DType::bf16);
    return {bf != out.end() ? *bf : out.front()};
  }
  return out;
}

Device device_for(const Options& opt, const KernelEntry& k) {
  return k.desc.device == DeviceKind::cuda ? Device::cuda(opt.cuda_device) : Device::cpu();
}

bool is_backward_op(const Registry& reg, const OpEntry& op) {
  for (const OpEntry* o : reg.ops())
    if (o->backward == op.name) return true;
  return false;
}

void progress(const Options& opt, size_t done, size_t total, const std::string& what) {
  if (!opt.progress) return;
  std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

std::string today_iso() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

}  // namespace opforge::harness::detail
