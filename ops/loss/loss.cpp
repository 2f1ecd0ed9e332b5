// Loss family: checks, shape functions, cost models and registration (ops/loss/loss.h).
#include <cmath>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "opforge/checks.h"
#include "opforge/error.h"
#include "ops/loss/internal.h"

namespace opforge {

namespace {

// An [N, V] floating input with Note [row layout] rows.
void check_matrix(const char* op, const char* arg, const TensorView& t) {
  expect_row_tensor(op, arg, t);
  if (t.ndim != 2) throw_argument_error(op, arg, "2 dims [N, V]", t.str());
}

// A second [N, V] input or output like `ref`.
void check_like(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                const TensorView& ref) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, ref_arg, ref);
  expect_same_shape(op, arg, t, ref_arg, ref);
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, ref_arg, ref);
}

// int64 [rows] ids on ref's device.
void check_ids(const char* op, const char* arg, const TensorView& ids, const TensorView& ref) {
  expect_defined(op, arg, ids);
  expect_dtype(op, arg, ids, DType::i64);
  expect_shape(op, arg, ids, Shape{ref.size(0)});
  expect_same_device(op, arg, ids, "logits", ref);
}

void check_reduction(const char* op, std::string_view reduction,
                     std::initializer_list<const char*> allowed) {
  std::string names;
  for (const char* a : allowed) {
    if (reduction == a) return;
    names += names.empty() ? "one of " : ", ";
    names += a;
  }
  throw_argument_error(op, "reduction", names, "'" + std::string(reduction) + "'");
}

// Shape of a reduced or per-row loss.
Shape loss_shape(Reduction r, const TensorView& x, bool per_element) {
  if (r != Reduction::none) return Shape{1};
  return per_element ? x.shape_of() : Shape{x.size(0)};
}

// The loss output: loss_shape, dtype by Note [loss outputs].
void check_loss_out(const char* op, const TensorView& loss, const TensorView& x, Reduction r,
                    bool per_element) {
  expect_defined(op, "loss", loss);
  expect_dtype(op, "loss", loss, r == Reduction::none && per_element ? x.dtype : loss_dtype(x.dtype));
  expect_shape(op, "loss", loss, loss_shape(r, x, per_element));
  expect_rows_uniform(op, "loss", loss);
  expect_same_device(op, "loss", loss, "input", x);
}

// dloss: floating, the shape of the forward loss; element-wise upstream gradients need x's dtype.
void check_dloss(const char* op, const TensorView& dloss, const TensorView& x, Reduction r,
                 bool per_element) {
  expect_defined(op, "dloss", dloss);
  expect_floating(op, "dloss", dloss);
  if (r == Reduction::none && per_element) expect_dtype(op, "dloss", dloss, x.dtype);
  expect_shape(op, "dloss", dloss, loss_shape(r, x, per_element));
  expect_rows_uniform(op, "dloss", dloss);
  expect_same_device(op, "dloss", dloss, "input", x);
}

void no_overlap(const char* op, const char* out, const TensorView& o,
                std::initializer_list<std::pair<const char*, const TensorView*>> others) {
  for (const auto& [name, t] : others)
    if (t->defined()) expect_no_overlap(op, out, o, name, *t);
}

// Every target in [0, V) or equal to ignore_index (read on the host; CPU tensors only).
void check_target_range(const char* op, const TensorView& target, int64_t vocab,
                        int64_t ignore_index) {
  if (!target.device.is_cpu()) return;
  const int64_t* t = target.ptr<const int64_t>();
  for (int64_t i = 0; i < target.size(0); ++i) {
    const int64_t id = t[i * target.stride(0)];
    if (id != ignore_index && (id < 0 || id >= vocab))
      throw_argument_error(op, "target",
                           "ids in [0, " + std::to_string(vocab) + ") or ignore_index " +
                               std::to_string(ignore_index),
                           "target[" + std::to_string(i) + "] = " + std::to_string(id));
  }
}

void check_ce_scalars(const char* op, double label_smoothing, double lse_square_scale,
                      double softcap, std::string_view reduction) {
  expect_finite_scalar(op, "label_smoothing", label_smoothing, 0.0);
  if (label_smoothing > 1.0)
    throw_argument_error(op, "label_smoothing", "a value in [0, 1]", std::to_string(label_smoothing));
  expect_finite_scalar(op, "lse_square_scale", lse_square_scale, 0.0);
  expect_finite_scalar(op, "softcap", softcap, 0.0);
  check_reduction(op, reduction, {"none", "sum", "mean"});
}

void check_labels(const char* op, const TensorView& labels, const TensorView& x) {
  if (labels.defined()) check_ids(op, "labels", labels, x);
}

void check_beta(const char* op, double beta) {
  expect_finite_scalar(op, "beta", beta, 0.0);
  if (beta > 1.0) throw_argument_error(op, "beta", "a value in [0, 1]", std::to_string(beta));
}

// cross_entropy's outputs: the loss (per row or reduced) and lse [N], both of loss_dtype.
void check_ce_outputs(const char* op, const TensorView& loss, const TensorView& lse,
                      const TensorView& logits, std::string_view reduction) {
  check_loss_out(op, loss, logits, reduction_of(reduction), false);
  expect_defined(op, "lse", lse);
  expect_dtype(op, "lse", lse, loss_dtype(logits.dtype));
  expect_shape(op, "lse", lse, Shape{logits.size(0)});
  expect_rows_uniform(op, "lse", lse);
  expect_same_device(op, "lse", lse, "logits", logits);
}

}  // namespace

void CrossEntropy::check(const TensorView& loss, const TensorView& lse, const TensorView& logits,
                         const TensorView& target, int64_t ignore_index, double label_smoothing,
                         double lse_square_scale, double softcap, std::string_view reduction) {
  check_matrix(name, "logits", logits);
  check_ids(name, "target", target, logits);
  check_ce_scalars(name, label_smoothing, lse_square_scale, softcap, reduction);
  check_ce_outputs(name, loss, lse, logits, reduction);
  no_overlap(name, "loss", loss, {{"logits", &logits}, {"target", &target}, {"lse", &lse}});
  no_overlap(name, "lse", lse, {{"logits", &logits}, {"target", &target}});
  check_target_range(name, target, logits.size(1), ignore_index);
}

void CrossEntropyWithGrad::check(const TensorView& loss, const TensorView& lse,
                                 const TensorView& dlogits, const TensorView& logits,
                                 const TensorView& target, const TensorView& dloss,
                                 int64_t ignore_index, double label_smoothing,
                                 double lse_square_scale, double softcap,
                                 std::string_view reduction) {
  check_matrix(name, "logits", logits);
  check_ids(name, "target", target, logits);
  check_ce_scalars(name, label_smoothing, lse_square_scale, softcap, reduction);
  check_dloss(name, dloss, logits, reduction_of(reduction), false);
  check_ce_outputs(name, loss, lse, logits, reduction);
  check_like(name, "dlogits", dlogits, "logits", logits);
  no_overlap(name, "loss", loss,
             {{"logits", &logits}, {"target", &target}, {"dloss", &dloss}, {"lse", &lse},
              {"dlogits", &dlogits}});
  no_overlap(name, "lse", lse,
             {{"logits", &logits}, {"target", &target}, {"dloss", &dloss}, {"dlogits", &dlogits}});
  no_overlap(name, "dlogits", dlogits, {{"logits", &logits}, {"target", &target}, {"dloss", &dloss}});
  check_target_range(name, target, logits.size(1), ignore_index);
}

void CrossEntropyBackward::check(const TensorView& dlogits, const TensorView& dloss,
                                 const TensorView& logits, const TensorView& target,
                                 const TensorView& lse, int64_t ignore_index,
                                 double label_smoothing, double lse_square_scale, double softcap,
                                 std::string_view reduction) {
  check_matrix(name, "logits", logits);
  check_ids(name, "target", target, logits);
  check_ce_scalars(name, label_smoothing, lse_square_scale, softcap, reduction);
  check_dloss(name, dloss, logits, reduction_of(reduction), false);
  expect_defined(name, "lse", lse);
  expect_floating(name, "lse", lse);
  expect_shape(name, "lse", lse, Shape{logits.size(0)});
  expect_same_device(name, "lse", lse, "logits", logits);
  check_like(name, "dlogits", dlogits, "logits", logits);
  no_overlap(name, "dlogits", dlogits,
             {{"dloss", &dloss}, {"logits", &logits}, {"target", &target}, {"lse", &lse}});
  check_target_range(name, target, logits.size(1), ignore_index);
}

void KlDiv::check(const TensorView& loss, const TensorView& y_pred, const TensorView& y_true,
                  bool, std::string_view reduction, double eps) {
  check_matrix(name, "y_pred", y_pred);
  check_like(name, "y_true", y_true, "y_pred", y_pred);
  check_reduction(name, reduction, {"none", "sum", "mean", "batchmean"});
  expect_finite_scalar(name, "eps", eps, 0.0);
  check_loss_out(name, loss, y_pred, reduction_of(reduction), true);
  no_overlap(name, "loss", loss, {{"y_pred", &y_pred}, {"y_true", &y_true}});
}

void KlDivBackward::check(const TensorView& dy_pred, const TensorView& dloss,
                          const TensorView& y_true, bool, std::string_view reduction, double eps) {
  check_matrix(name, "y_true", y_true);
  check_reduction(name, reduction, {"none", "sum", "mean", "batchmean"});
  expect_finite_scalar(name, "eps", eps, 0.0);
  check_dloss(name, dloss, y_true, reduction_of(reduction), true);
  check_like(name, "dy_pred", dy_pred, "y_true", y_true);
  no_overlap(name, "dy_pred", dy_pred, {{"dloss", &dloss}, {"y_true", &y_true}});
}

void Jsd::check(const TensorView& loss, const TensorView& input, const TensorView& target,
                const TensorView& labels, double beta, int64_t) {
  check_matrix(name, "input", input);
  check_like(name, "target", target, "input", input);
  check_labels(name, labels, input);
  check_beta(name, beta);
  check_loss_out(name, loss, input, Reduction::sum, true);
  no_overlap(name, "loss", loss, {{"input", &input}, {"target", &target}, {"labels", &labels}});
}

void JsdBackward::check(const TensorView& dinput, const TensorView& dloss,
                        const TensorView& input, const TensorView& target,
                        const TensorView& labels, double beta, int64_t) {
  check_matrix(name, "input", input);
  check_like(name, "target", target, "input", input);
  check_labels(name, labels, input);
  check_beta(name, beta);
  check_dloss(name, dloss, input, Reduction::sum, true);
  check_like(name, "dinput", dinput, "input", input);
  no_overlap(name, "dinput", dinput,
             {{"dloss", &dloss}, {"input", &input}, {"target", &target}, {"labels", &labels}});
}

void Tvd::check(const TensorView& loss, const TensorView& p, const TensorView& q,
                const TensorView& labels, std::string_view reduction, int64_t) {
  check_matrix(name, "p", p);
  check_like(name, "q", q, "p", p);
  check_labels(name, labels, p);
  check_reduction(name, reduction, {"none", "sum", "mean", "batchmean"});
  check_loss_out(name, loss, p, reduction_of(reduction), true);
  no_overlap(name, "loss", loss, {{"p", &p}, {"q", &q}, {"labels", &labels}});
}

void TvdBackward::check(const TensorView& dp, const TensorView& dloss, const TensorView& p,
                        const TensorView& q, const TensorView& labels, std::string_view reduction,
                        int64_t) {
  check_matrix(name, "p", p);
  check_like(name, "q", q, "p", p);
  check_labels(name, labels, p);
  check_reduction(name, reduction, {"none", "sum", "mean", "batchmean"});
  check_dloss(name, dloss, p, reduction_of(reduction), true);
  check_like(name, "dp", dp, "p", p);
  no_overlap(name, "dp", dp, {{"dloss", &dloss}, {"p", &p}, {"q", &q}, {"labels", &labels}});
}

namespace {

// Flops per element: cross_entropy max 1, exp ~10, sum 1 (+ softcap tanh ~20); its backward
// exp ~10 and 3 multiply-adds. kl_div log ~10 + 2; jsd two exps and a log ~32; tvd 3.
constexpr double kCeFlops = 12, kCeBackwardFlops = 16, kKlFlops = 12, kKlBackwardFlops = 2,
                 kJsdFlops = 36, kJsdBackwardFlops = 36, kTvdFlops = 3, kTvdBackwardFlops = 2;

double ids_bytes(const ArgList& a, const char* name) {
  return a.is_none(name) ? 0.0 : bytes_of(a.tensor(name));
}

template <class Op, class Ref, class Cpu>
void add_kernels(Registry& reg, Ref reference, Cpu cpu, const char* summary) {
  reg.add_kernel<Op>(reference_kernel_desc("plain loops, double accumulation"), reference);
  // Applicable when the first [N, V] argument (the output, as every output here is [N, V] or
  // follows one) is a cpu tensor of f32 / bf16 / f16.
  reg.add_kernel<Op>(cpu_kernel_desc(summary), cpu, [](auto... args) -> const char* {
    const TensorView* first_floating = nullptr;
    auto pick = [&](const auto& v) {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, TensorView>)
        if (!first_floating && v.defined() && v.ndim == 2) first_floating = &v;
    };
    (pick(args), ...);
    return first_floating ? loss_cpu_reason(*first_floating) : "no [N, V] input";
  });
}

void register_cross_entropy(Registry& reg) {
  OpEntry& op = reg.add_op<CrossEntropy>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("logits");
    return std::vector<OutputSpec>{
        {"loss", loss_shape(reduction_of(a.str("reduction")), x, false), loss_dtype(x.dtype)},
        {"lse", Shape{x.size(0)}, loss_dtype(x.dtype)}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView& x = a.tensor("logits");
    const double lse_bytes = double(x.size(0)) * double(dtype_size(loss_dtype(x.dtype)));
    return Cost{bytes_of(x) + bytes_of(a.tensor("target")) + 2 * lse_bytes,
                kCeFlops * double(x.numel())};
  };
  op.cases = cross_entropy_cases;
  add_kernels<CrossEntropy>(reg, &cross_entropy_reference, &cross_entropy_cpu,
                            "Highway + OpenMP; one read of the logits, online max/sum per L1 "
                            "block, one vector exp per element");

  OpEntry& bwd = reg.add_op<CrossEntropyBackward>();
  bwd.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("logits");
    return std::vector<OutputSpec>{{"dlogits", x.shape_of(), x.dtype}};
  };
  bwd.cost = [](const ArgList& a) {
    const TensorView& x = a.tensor("logits");
    return Cost{2 * bytes_of(x) + bytes_of(a.tensor("target")) + bytes_of(a.tensor("lse")) +
                    bytes_of(a.tensor("dloss")),
                kCeBackwardFlops * double(x.numel())};
  };
  bwd.cases = cross_entropy_backward_cases;
  add_kernels<CrossEntropyBackward>(reg, &cross_entropy_backward_reference,
                                    &cross_entropy_backward_cpu,
                                    "Highway + OpenMP; p = exp(z - lse) from the saved lse, one "
                                    "sweep per row, target entry in f32");

  // The fused op reads the logits once (the floor): fewest bytes are the logits read, dlogits
  // written, target, dloss, loss and lse.
  OpEntry& fused = reg.add_op<CrossEntropyWithGrad>();
  fused.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("logits");
    return std::vector<OutputSpec>{
        {"loss", loss_shape(reduction_of(a.str("reduction")), x, false), loss_dtype(x.dtype)},
        {"lse", Shape{x.size(0)}, loss_dtype(x.dtype)},
        {"dlogits", x.shape_of(), x.dtype}};
  };
  fused.cost = [](const ArgList& a) {
    const TensorView& x = a.tensor("logits");
    const double lse_bytes = double(x.size(0)) * double(dtype_size(loss_dtype(x.dtype)));
    return Cost{2 * bytes_of(x) + bytes_of(a.tensor("target")) + bytes_of(a.tensor("dloss")) +
                    2 * lse_bytes,
                (kCeFlops + kCeBackwardFlops) * double(x.numel())};
  };
  fused.cases = cross_entropy_with_grad_cases;
  add_kernels<CrossEntropyWithGrad>(reg, &cross_entropy_with_grad_reference,
                                    &cross_entropy_with_grad_cpu,
                                    "Highway + OpenMP; per row the forward's online max/sum, then "
                                    "the gradient sweep while the row is still in cache");
}

// kl_div, jsd and tvd: forward reads both inputs and writes the loss; backward reads the inputs
// it needs and dloss, writes one gradient.
template <class Fwd, class Bwd, class FwdRef, class FwdCpu, class BwdRef, class BwdCpu>
void register_pair(Registry& reg, const char* a_name, const char* b_name, bool backward_reads_a,
                   double fwd_flops, double bwd_flops, std::vector<Case> (*fwd_cases)(),
                   std::vector<Case> (*bwd_cases)(), FwdRef fwd_ref, FwdCpu fwd_cpu,
                   BwdRef bwd_ref, BwdCpu bwd_cpu, const char* summary) {
  OpEntry& op = reg.add_op<Fwd>();
  op.outputs = [a_name](const ArgList& a) {
    const TensorView& x = a.tensor(a_name);
    const Reduction r = std::string_view(Fwd::name) == "jsd" ? Reduction::sum
                                                             : reduction_of(a.str("reduction"));
    return std::vector<OutputSpec>{{"loss", loss_shape(r, x, true),
                                    r == Reduction::none ? x.dtype : loss_dtype(x.dtype)}};
  };
  op.cost = [a_name, fwd_flops](const ArgList& a) {
    const TensorView& x = a.tensor(a_name);
    const bool none = std::string_view(Fwd::name) != "jsd" && a.str("reduction") == "none";
    const double labels = std::string_view(Fwd::name) != "kl_div" ? ids_bytes(a, "labels") : 0.0;
    return Cost{(none ? 3 : 2) * bytes_of(x) + labels, fwd_flops * double(x.numel())};
  };
  op.cases = fwd_cases;
  add_kernels<Fwd>(reg, fwd_ref, fwd_cpu, summary);

  OpEntry& bwd = reg.add_op<Bwd>();
  const char* grad_name = Bwd::args[0].name;
  bwd.outputs = [b_name, grad_name](const ArgList& a) {
    const TensorView& x = a.tensor(b_name);
    return std::vector<OutputSpec>{{grad_name, x.shape_of(), x.dtype}};
  };
  bwd.cost = [b_name, backward_reads_a, bwd_flops](const ArgList& a) {
    const TensorView& x = a.tensor(b_name);
    return Cost{(backward_reads_a ? 3 : 2) * bytes_of(x) + bytes_of(a.tensor("dloss")),
                bwd_flops * double(x.numel())};
  };
  bwd.cases = bwd_cases;
  add_kernels<Bwd>(reg, bwd_ref, bwd_cpu, summary);
}

}  // namespace

void register_loss(Registry& reg) {
  register_cross_entropy(reg);
  register_pair<KlDiv, KlDivBackward>(
      reg, "y_pred", "y_true", false, kKlFlops, kKlBackwardFlops, kl_div_cases,
      kl_div_backward_cases, &kl_div_reference, &kl_div_cpu, &kl_div_backward_reference,
      &kl_div_backward_cpu, "Highway + OpenMP; element loss with a vector log, row sums in blocks");
  register_pair<Jsd, JsdBackward>(
      reg, "input", "target", true, kJsdFlops, kJsdBackwardFlops, jsd_cases, jsd_backward_cases,
      &jsd_reference, &jsd_cpu, &jsd_backward_reference, &jsd_backward_cpu,
      "Highway + OpenMP; two vector exps and a log per element, row sums in blocks");
  register_pair<Tvd, TvdBackward>(
      reg, "p", "q", true, kTvdFlops, kTvdBackwardFlops, tvd_cases, tvd_backward_cases,
      &tvd_reference, &tvd_cpu, &tvd_backward_reference, &tvd_backward_cpu,
      "Highway + OpenMP; |p - q| per element, row sums in blocks");
}

}  // namespace opforge
