// opforge call OP arg=value ... [--out name=path.npy ...] [--dtype D] [--device D] [--explain]
//
// Tensor arguments are .npy paths, scalars are literals, omitted scalars take their defaults.
// Outputs are allocated from the op's shape function and named by their argument names; --out
// writes one to a .npy file (bf16 is written as f32, see npy.h), the others are summarised.
#include <iostream>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "opforge/error.h"
#include "opforge/npy.h"
#include "opforge/registry.h"
#include "tools/cli.h"

namespace opforge::cli {

namespace {

struct CallFlags {
  Common common;
  std::string op;
  std::vector<std::string> args;
  std::vector<std::string> outs;
  std::string dtype;
  std::string device = "cpu";
  bool explain = false;
};

std::pair<std::string, std::string> split_assignment(const std::string& s, const char* what) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(ErrorCode::parse, std::string(what) + " '" + s + "': expected name=value");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

std::string summary(const TensorView& t) {
  Tensor host = Tensor::copy_of(t, Device::cpu(), t.dtype);
  std::string s = t.str() + ": ";
  int64_t n = std::min<int64_t>(host.numel(), 6);
  for (int64_t i = 0; i < n; ++i) s += fmt::format("{}{:.6g}", i ? ", " : "", load_as_double(host.data(), host.dtype(), i));
  return s + (host.numel() > n ? ", ..." : "");
}

// Argument values from name=value pairs; tensors are read, converted and moved to the device.
void gather_arguments(const OpEntry& op, const CallFlags& f, Device device, std::vector<Value>& values,
                      std::vector<Tensor>& owned) {
  std::vector<bool> given(op.args.size(), false);
  for (const std::string& a : f.args) {
    auto [name, text] = split_assignment(a, "argument");
    size_t i = op.arg_index(name);
    const ArgInfo& info = op.args[i];
    if (info.role == ArgRole::out)
      throw Error(ErrorCode::invalid_argument,
                  op.name + ": '" + name + "' is an output; name its file with --out " + name + "=path.npy");
    given[i] = true;
    if (info.type != ArgType::tensor) { values[i] = parse_scalar_literal(op.name, info, text); continue; }
    if (text == "none" && info.role == ArgRole::opt_in) { values[i] = None{}; continue; }
    Tensor t = read_npy(text);
    DType dt = !f.dtype.empty() && is_floating(t.dtype()) ? parse_dtype(f.dtype) : t.dtype();
    owned[i] = Tensor::copy_of(t.view(), device, dt);
    values[i] = owned[i].view();
  }
  for (size_t i = 0; i < op.args.size(); ++i) {
    const ArgInfo& info = op.args[i];
    if (given[i] || info.role == ArgRole::out) continue;
    if (info.role == ArgRole::opt_in) { values[i] = None{}; continue; }
    if (!info.has_default)
      throw Error(ErrorCode::invalid_argument, op.name + ": argument '" + info.name +
                                                   "' is required (signature: " + op.signature + ")");
    values[i] = parse_scalar_literal(op.name, info, info.default_value);
  }
}

// Outputs from the op's shape function, allocated on the device.
void allocate_outputs(const OpEntry& op, Device device, std::vector<Value>& values, std::vector<Tensor>& owned) {
  if (!op.outputs) return;
  std::vector<Value> probe = values;
  for (size_t i = 0; i < op.args.size(); ++i)
    if (op.args[i].role == ArgRole::out) probe[i] = None{};
  for (const OutputSpec& s : op.outputs(ArgList(op.name, op.args, probe))) {
    size_t i = op.arg_index(s.name);
    owned[i] = Tensor::empty(s.shape, s.dtype, device);
    values[i] = owned[i].view();
  }
}

std::map<std::string, std::string> output_paths(const OpEntry& op, const CallFlags& f) {
  std::map<std::string, std::string> paths;
  for (const std::string& o : f.outs) {
    auto [name, path] = split_assignment(o, "--out");
    ArgRole role = op.args[op.arg_index(name)].role;
    if (role != ArgRole::out && role != ArgRole::inout)
      throw Error(ErrorCode::invalid_argument, op.name + ": --out " + name + ": not an output of the op");
    paths[name] = path;
  }
  return paths;
}

void run_call(const CallFlags& f) {
  const Registry& reg = global_registry();
  const OpEntry& op = reg.op(f.op);
  Policy policy = f.common.policy();
  Device device = parse_device(f.device);
  std::vector<Value> values(op.args.size());
  std::vector<Tensor> owned(op.args.size());
  gather_arguments(op, f, device, values, owned);
  allocate_outputs(op, device, values, owned);
  std::map<std::string, std::string> paths = output_paths(op, f);  // validated before the call
  Decision d = reg.decide(op, policy, device);
  const KernelEntry& ran = reg.call(d, values);
  if (f.explain) std::cout << d.explain();
  std::cout << op.name << ": ran " << ran.impl() << " on " << device.str() << "\n";
  for (size_t i = 0; i < op.args.size(); ++i) {
    const ArgInfo& info = op.args[i];
    if (info.role != ArgRole::out && info.role != ArgRole::inout) continue;
    const TensorView& t = owned[i].view();
    if (auto it = paths.find(info.name); it != paths.end()) {
      write_npy(it->second, Tensor::copy_of(t, Device::cpu(), t.dtype).view());
      std::cout << "  " << info.name << " -> " << it->second << " (" << t.str() << ")\n";
    } else {
      std::cout << "  " << info.name << " = " << summary(t) << "\n";
    }
  }
}

}  // namespace

void add_call(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("call", "run one op on .npy inputs through the policy's kernel");
  auto f = std::make_shared<CallFlags>();
  add_common(*cmd, f->common);
  cmd->add_option("op", f->op, "op name")->required();
  cmd->add_option("args", f->args, "arguments as name=value (tensors: .npy paths)");
  cmd->add_option("--out", f->outs, "write an output: name=path.npy (repeatable)");
  cmd->add_option("--dtype", f->dtype, "convert floating inputs to bf16, f16, f32 or f64");
  cmd->add_option("--device", f->device, "cpu or cuda:N");
  cmd->add_flag("--explain", f->explain, "print the decision trace");
  cmd->callback([f, &status] {
    run_call(*f);
    status = 0;
  });
}

}  // namespace opforge::cli
