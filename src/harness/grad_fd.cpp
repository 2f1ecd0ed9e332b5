// grad mode, part one: the reference backward against central finite differences of the
// reference forward, all in f64 on the CPU.
//
// Note [gradient naming]: a backward op's arguments are matched to its forward op by name.
// "d<name>" as an output is the gradient of forward input <name>; "d<name>" as an input is the
// upstream gradient of forward output <name>; any other argument takes the forward argument (or
// forward output) of the same name. The checked quantity is L = sum over forward outputs o of
// sum(do * o) with fixed random do, so dL/dinput must equal what the backward op returns.
// A gradient output whose forward input is an optional one the case leaves out (db of a forward
// without bias) is still allocated, from the backward's shape function, and is not checked.
//
// In-place ops: a forward `inout` argument is both an input and an output of the same name (its
// value after the call). A backward `inout` argument "d<name>" is then both: it holds the
// upstream gradient of output <name> on entry and the gradient of input <name> on return
// (rotary_embedding_backward rotates dquery in place).
#include <cmath>
#include <map>

#include "harness/fuzz.h"
#include "harness/instance.h"
#include "opforge/error.h"
#include "opforge/harness.h"

namespace opforge::harness {

using namespace detail;

namespace {

constexpr size_t kMaxProbesPerInput = 48;  // elements perturbed per differentiable input
// Elements of the largest tensor of a fuzz draw that finite differences take: each probe runs the
// forward reference twice, so draws beyond this are left to test mode on the backward op.
constexpr int64_t kFdMaxFuzzElements = int64_t(1) << 15;

bool fd_sized(const Case& c) {
  for (const CaseArg& a : c.args)
    if (const auto* t = std::get_if<TensorInit>(&a.init); t && t->shape.numel() > kFdMaxFuzzElements) return false;
  return true;
}

struct ForwardRun {
  PlainArgs args;
  std::map<std::string, std::vector<double>> outputs;
};

ForwardRun run_forward(const Registry& reg, const OpEntry& op, const std::vector<ArgPlan>& plan,
                       const std::vector<std::vector<double>>& masters) {
  ForwardRun f{make_plain(op, plan, masters, DType::f64, Device::cpu()), {}};
  reg.call(only(op, *op.reference(), Device::cpu()), f.args.values);
  for (size_t i = 0; i < plan.size(); ++i)
    if (plan[i].is_output || op.args[i].role == ArgRole::inout)
      f.outputs[op.args[i].name] = tensor_values(f.args.tensors[i]);
  return f;
}

double loss(const ForwardRun& f, const std::map<std::string, std::vector<double>>& upstream) {
  double l = 0;
  for (const auto& [name, dy] : upstream) {
    const std::vector<double>& y = f.outputs.at(name);
    for (size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
  }
  return l;
}

Result check_case(const Registry& reg, const Options& opt, const OpEntry& fwd, const OpEntry& bwd,
                  const Case& c) {
  Result r{"grad", fwd.name, "reference", "cpu", "f64", c.label, case_group_name(c.group)};
  r.detail = "reference backward vs central differences";
  std::vector<ArgPlan> plan = plan_case(fwd, c);
  auto masters = input_masters(fwd, c, plan, DType::f64, opt.seed);
  ForwardRun base;
  try {
    base = run_forward(reg, fwd, plan, masters);
  } catch (const Error& e) {
    if (opt.fuzz <= 0) throw;
    r.rejected = true;  // a fuzz draw the forward's reference refuses: nothing to differentiate
    r.detail = std::string("rejected by the reference: ") + e.what();
    return r;
  }

  // Backward arguments by Note [gradient naming].
  std::vector<Tensor> keep;
  std::vector<Value> bvals(bwd.args.size());
  std::map<std::string, std::vector<double>> upstream;
  std::map<std::string, size_t> grad_out;  // forward input name -> backward arg index
  std::vector<size_t> absent_grads;        // backward outputs of forward inputs left out
  for (size_t i = 0; i < bwd.args.size(); ++i) {
    const ArgInfo& a = bwd.args[i];
    std::string base_name = a.name.size() > 1 && a.name[0] == 'd' ? a.name.substr(1) : "";
    bool in_place_grad = a.role == ArgRole::inout && !base_name.empty() && base.outputs.count(base_name);
    if (a.role == ArgRole::out && !base_name.empty()) {
      const Value& fv = base.args.values[fwd.arg_index(base_name)];
      if (!std::holds_alternative<TensorView>(fv)) {  // an optional input the case leaves out
        absent_grads.push_back(i);
        continue;
      }
      const TensorView& x = std::get<TensorView>(fv);
      keep.push_back(Tensor::zeros(x.shape_of(), DType::f64));
      bvals[i] = keep.back().view();
      grad_out[base_name] = i;
    } else if ((a.role == ArgRole::in && !base_name.empty() && base.outputs.count(base_name)) ||
               in_place_grad) {
      const std::vector<double>& y = base.outputs[base_name];
      Rng rng(mix_seed(opt.seed, bwd.name, c.label, a.name));
      std::vector<double> dy(y.size());
      for (double& v : dy) v = rng.normal();
      const TensorView& yv = std::get<TensorView>(base.args.values[fwd.arg_index(base_name)]);
      keep.push_back(make_tensor(yv.shape_of(), DType::f64, Device::cpu(), dy));
      bvals[i] = keep.back().view();
      upstream[base_name] = std::move(dy);
      if (in_place_grad) grad_out[base_name] = i;  // overwritten with the input's gradient
    } else {
      bvals[i] = base.args.values[fwd.arg_index(a.name)];
    }
  }
  // The gradient of an optional forward input left out (e.g. no bias) is still an output of the
  // backward op: allocated from its shape function, not compared (there is nothing to perturb).
  if (!absent_grads.empty()) {
    std::vector<OutputSpec> specs = output_specs(bwd, bvals);
    for (size_t i : absent_grads)
      for (const OutputSpec& s : specs)
        if (s.name == bwd.args[i].name) {
          keep.push_back(Tensor::zeros(s.shape, DType::f64));
          bvals[i] = keep.back().view();
        }
  }
  reg.call(only(bwd, *bwd.reference(), Device::cpu()), bvals);

  for (const auto& [name, bi] : grad_out) {
    size_t fi = fwd.arg_index(name);
    std::vector<double> analytic = tensor_values(std::get<TensorView>(bvals[bi]));
    double scale = 1;
    for (double g : analytic) scale = std::max(scale, std::fabs(g));
    size_t n = masters[fi].size();
    size_t step = std::max<size_t>(1, n / kMaxProbesPerInput);
    for (size_t e = 0; e < n; e += step) {
      double x0 = masters[fi][e];
      double h = 1e-6 * std::max(1.0, std::fabs(x0));
      auto perturbed = masters;
      perturbed[fi][e] = x0 + h;
      double lp = loss(run_forward(reg, fwd, plan, perturbed), upstream);
      perturbed[fi][e] = x0 - h;
      double lm = loss(run_forward(reg, fwd, plan, perturbed), upstream);
      double numeric = (lp - lm) / (2 * h);
      double err = std::fabs(numeric - analytic[e]);
      r.max_abs_err = std::max(r.max_abs_err, err / scale);
      if (err > 1e-5 * scale) {
        r.status = Status::fail;
        r.detail = "d" + name + "[" + std::to_string(e) + "]: backward " + std::to_string(analytic[e]) +
                   ", central difference " + std::to_string(numeric);
        return r;
      }
    }
  }
  r.detail += ", max err / max|grad| " + std::to_string(r.max_abs_err);
  return r;
}

}  // namespace

Report finite_difference_checks(const Registry& reg, const Options& opt) {
  Report rep;
  rep.date = today_iso();
  rep.fuzz = opt.fuzz;
  rep.fuzz_seed = opt.fuzz_seed;
  bool want_reference = opt.backends.empty();
  for (const std::string& b : opt.backends) want_reference |= b == "reference";
  if (!want_reference) return rep;
  for (const OpEntry* op : reg.ops()) {
    if (!op_selected(opt, *op) || op->backward.empty() || !op->cases) continue;
    const OpEntry& bwd = reg.op(op->backward);
    if (!op->reference() || !bwd.reference()) continue;
    // Fuzz: the forward op's draws (the same as test mode's), those from small and edge cases
    // whose inputs stay within kFdMaxFuzzElements.
    const std::vector<Case> cases = opt.fuzz > 0 ? fuzz_cases(opt, *op) : op->cases();
    for (const Case& c : cases) {
      // Finite differences re-run the forward per probe: small and edge cases only.
      if (c.group != CaseGroup::small && c.group != CaseGroup::edge) continue;
      if (opt.fuzz <= 0 && !opt.cases.empty() && !case_selected(opt, c, false)) continue;
      if (opt.fuzz > 0 && !fd_sized(c)) continue;
      progress(opt, 0, 1, "grad " + op->name + " " + c.label);
      Result r;
      try {
        r = check_case(reg, opt, *op, bwd, c);
      } catch (const std::exception& e) {
        r = Result{"grad", op->name, "reference", "cpu", "f64", c.label, case_group_name(c.group),
                   Status::fail, std::string("harness error: ") + e.what()};
      }
      rep.results.push_back(std::move(r));
    }
  }
  progress(opt, 1, 1, "");
  return rep;
}

}  // namespace opforge::harness
