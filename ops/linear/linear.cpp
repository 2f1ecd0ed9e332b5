// Linear family: checks, shape functions, cost models and registration (ops/linear/linear.h).
#include <string>
#include <utility>

#include "opforge/checks.h"
#include "opforge/error.h"
#include "ops/linear/internal.h"

namespace opforge {

namespace {

void expect_ndim(const char* op, const char* arg, const TensorView& t, int ndim, const char* what) {
  expect_defined(op, arg, t);
  if (t.ndim != ndim) throw_argument_error(op, arg, what, t.str());
}

// A matrix argument: defined, `ref`'s dtype and device, `shape`, Note [row layout].
void check_matrix(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                  const TensorView& ref, const Shape& shape) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, ref_arg, ref);
  expect_shape(op, arg, t, shape);
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, ref_arg, ref);
}

// x's shape with the last dim replaced by `last`.
Shape with_last(const TensorView& x, int64_t last) {
  Shape s = x.shape_of();
  s.dims[size_t(s.ndim - 1)] = last;
  return s;
}

// x: [..., in] and w: [out, in] of one floating dtype.
void check_x_and_w(const char* op, const TensorView& x, const TensorView& w) {
  expect_row_tensor(op, "x", x);
  expect_ndim(op, "w", w, 2, "a 2-d tensor [out, in]");
  check_matrix(op, "w", w, "x", x, Shape{w.size(0), x.size(-1)});
}

void expect_no_overlaps(const char* op, std::initializer_list<std::pair<const char*, const TensorView*>> outs,
                        std::initializer_list<std::pair<const char*, const TensorView*>> others) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    for (const auto& [arg, t] : others)
      if (t->defined()) expect_no_overlap(op, o->first, *o->second, arg, *t);
    for (auto p = std::next(o); p != outs.end(); ++p)
      expect_no_overlap(op, o->first, *o->second, p->first, *p->second);
  }
}

}  // namespace

void Linear::check(const TensorView& y, const TensorView& x, const TensorView& w,
                   const TensorView& b) {
  check_x_and_w(name, x, w);
  const int64_t out = w.size(0);
  if (b.defined()) check_matrix(name, "b", b, "x", x, Shape{out});
  check_matrix(name, "y", y, "x", x, with_last(x, out));
  expect_no_overlaps(name, {{"y", &y}}, {{"x", &x}, {"w", &w}, {"b", &b}});
}

void LinearBackward::check(const TensorView& dx, const TensorView& dw, const TensorView& db,
                           const TensorView& dy, const TensorView& x, const TensorView& w) {
  check_x_and_w(name, x, w);
  const int64_t out = w.size(0);
  check_matrix(name, "dy", dy, "x", x, with_last(x, out));
  check_matrix(name, "dx", dx, "x", x, x.shape_of());
  check_matrix(name, "dw", dw, "w", w, w.shape_of());
  check_matrix(name, "db", db, "w", w, Shape{out});
  expect_no_overlaps(name, {{"dx", &dx}, {"dw", &dw}, {"db", &db}},
                     {{"dy", &dy}, {"x", &x}, {"w", &w}});
}

// ---- fused_linear_cross_entropy -------------------------------------------------------------

Reduction parse_reduction(std::string_view op, std::string_view text) {
  if (text == "none") return Reduction::none;
  if (text == "sum") return Reduction::sum;
  if (text == "mean") return Reduction::mean;
  throw_argument_error(op, "reduction", "one of none, sum, mean", "'" + std::string(text) + "'");
}

int64_t target_at(const TensorView& target, int64_t n) {
  return static_cast<const int64_t*>(target.data)[n * target.stride(0)];
}

int64_t count_targets(const TensorView& target, int64_t ignore_index) {
  int64_t count = 0;
  for (int64_t n = 0; n < target.size(0); ++n) count += target_at(target, n) != ignore_index;
  return count;
}

namespace {

DType loss_dtype(const TensorView& hidden) {
  return hidden.dtype == DType::f64 ? DType::f64 : DType::f32;
}
Shape loss_shape(const TensorView& hidden, Reduction r) {
  return r == Reduction::none ? Shape{hidden.size(0)} : Shape{};
}

// hidden [N, H], w [V, H], target int64 [N] with values in [0, V) or ignore_index, b [V] or none,
// label_smoothing in [0, 1], reduction known. Returns the reduction.
Reduction check_flce_inputs(const char* op, const TensorView& hidden, const TensorView& w,
                            const TensorView& target, const TensorView& b, int64_t ignore_index,
                            double label_smoothing, std::string_view reduction) {
  expect_row_tensor(op, "hidden", hidden);
  expect_ndim(op, "hidden", hidden, 2, "a 2-d tensor [tokens, hidden]");
  expect_ndim(op, "w", w, 2, "a 2-d tensor [vocab, hidden]");
  check_matrix(op, "w", w, "hidden", hidden, Shape{w.size(0), hidden.size(1)});
  if (w.size(0) < 1) throw_argument_error(op, "w", "a vocabulary of at least 1 row", w.str());
  if (b.defined()) check_matrix(op, "b", b, "hidden", hidden, Shape{w.size(0)});
  expect_defined(op, "target", target);
  expect_dtype(op, "target", target, DType::i64);
  expect_shape(op, "target", target, Shape{hidden.size(0)});
  expect_same_device(op, "target", target, "hidden", hidden);
  // Values are range-checked on the host only: reading device targets would synchronize (Note
  // [flce semantics]: a device target out of range gives that token a NaN loss).
  const int64_t vocab = w.size(0);
  for (int64_t n = 0; target.device.is_cpu() && n < target.size(0); ++n) {
    const int64_t t = target_at(target, n);
    if (t != ignore_index && (t < 0 || t >= vocab))
      throw_argument_error(op, "target",
                           "values in [0, " + std::to_string(vocab) + ") or ignore_index " +
                               std::to_string(ignore_index),
                           std::to_string(t) + " at index " + std::to_string(n));
  }
  expect_finite_scalar(op, "label_smoothing", label_smoothing, 0.0);
  if (label_smoothing > 1.0)
    throw_argument_error(op, "label_smoothing", "a value in [0, 1]", std::to_string(label_smoothing));
  return parse_reduction(op, reduction);
}

// lse [tokens] on hidden's device: the forward writes the loss dtype, the backward reads any
// floating dtype.
void check_lse(const char* op, const TensorView& lse, const TensorView& hidden, bool output) {
  expect_defined(op, "lse", lse);
  if (output) expect_dtype(op, "lse", lse, loss_dtype(hidden));
  else expect_floating(op, "lse", lse);
  expect_shape(op, "lse", lse, Shape{hidden.size(0)});
  expect_rows_uniform(op, "lse", lse);
  expect_same_device(op, "lse", lse, "hidden", hidden);
}

// loss (the reduction's shape) and lse, written in the loss dtype.
void check_loss_outputs(const char* op, const TensorView& loss, const TensorView& lse,
                        const TensorView& hidden, Reduction r) {
  expect_defined(op, "loss", loss);
  expect_dtype(op, "loss", loss, loss_dtype(hidden));
  expect_shape(op, "loss", loss, loss_shape(hidden, r));
  if (r == Reduction::none) expect_rows_uniform(op, "loss", loss);
  expect_same_device(op, "loss", loss, "hidden", hidden);
  check_lse(op, lse, hidden, true);
}

// dloss (the loss's shape, any floating dtype) and the gradients dhidden, dw, db.
void check_gradient_args(const char* op, const TensorView& dloss, const TensorView& dhidden,
                         const TensorView& dw, const TensorView& db, const TensorView& hidden,
                         const TensorView& w, Reduction r) {
  expect_defined(op, "dloss", dloss);
  expect_floating(op, "dloss", dloss);
  expect_shape(op, "dloss", dloss, loss_shape(hidden, r));
  expect_rows_uniform(op, "dloss", dloss);
  expect_same_device(op, "dloss", dloss, "hidden", hidden);
  check_matrix(op, "dhidden", dhidden, "hidden", hidden, hidden.shape_of());
  check_matrix(op, "dw", dw, "w", w, w.shape_of());
  check_matrix(op, "db", db, "w", w, Shape{w.size(0)});
}

}  // namespace

void FusedLinearCrossEntropy::check(const TensorView& loss, const TensorView& lse,
                                    const TensorView& hidden, const TensorView& w,
                                    const TensorView& target, const TensorView& b,
                                    int64_t ignore_index, double label_smoothing,
                                    std::string_view reduction) {
  const Reduction r =
      check_flce_inputs(name, hidden, w, target, b, ignore_index, label_smoothing, reduction);
  check_loss_outputs(name, loss, lse, hidden, r);
  expect_no_overlaps(name, {{"loss", &loss}, {"lse", &lse}},
                     {{"hidden", &hidden}, {"w", &w}, {"target", &target}, {"b", &b}});
}

void FusedLinearCrossEntropyBackward::check(const TensorView& dhidden, const TensorView& dw,
                                            const TensorView& db, const TensorView& dloss,
                                            const TensorView& hidden, const TensorView& w,
                                            const TensorView& target, const TensorView& lse,
                                            const TensorView& b, int64_t ignore_index,
                                            double label_smoothing, std::string_view reduction) {
  const Reduction r =
      check_flce_inputs(name, hidden, w, target, b, ignore_index, label_smoothing, reduction);
  check_lse(name, lse, hidden, false);
  check_gradient_args(name, dloss, dhidden, dw, db, hidden, w, r);
  expect_no_overlaps(name, {{"dhidden", &dhidden}, {"dw", &dw}, {"db", &db}},
                     {{"dloss", &dloss}, {"hidden", &hidden}, {"w", &w}, {"target", &target},
                      {"lse", &lse}, {"b", &b}});
}

void FusedLinearCrossEntropyWithGrad::check(const TensorView& loss, const TensorView& lse,
                                            const TensorView& dhidden, const TensorView& dw,
                                            const TensorView& db, const TensorView& hidden,
                                            const TensorView& w, const TensorView& target,
                                            const TensorView& dloss, const TensorView& b,
                                            int64_t ignore_index, double label_smoothing,
                                            std::string_view reduction) {
  const Reduction r =
      check_flce_inputs(name, hidden, w, target, b, ignore_index, label_smoothing, reduction);
  check_loss_outputs(name, loss, lse, hidden, r);
  check_gradient_args(name, dloss, dhidden, dw, db, hidden, w, r);
  expect_no_overlaps(name,
                     {{"loss", &loss}, {"lse", &lse}, {"dhidden", &dhidden}, {"dw", &dw}, {"db", &db}},
                     {{"dloss", &dloss}, {"hidden", &hidden}, {"w", &w}, {"target", &target}, {"b", &b}});
}

// ---- registration ---------------------------------------------------------------------------

namespace {

KernelDesc reference_desc() {
  return reference_kernel_desc("plain loops, double accumulation, one rounding per output");
}

// f32 sums of `in` products: rounding error grows with sqrt(in) (Note [tolerances] defaults are
// for row-wise ops), so the GEMM kernels compare with a looser f32 bound.
KernelDesc gemm_desc(const char* summary) {
  KernelDesc d = cpu_kernel_desc(summary);
  d.tolerances[DType::f32] = {1e-4, 1e-4, 1e-9};
  return d;
}

double bytes_or_zero(const ArgList& a, const char* name) {
  return a.is_none(name) ? 0.0 : bytes_of(a.tensor(name));
}

void register_linear_ops(Registry& reg) {
  OpEntry& op = reg.add_op<Linear>();
  op.outputs = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    Shape s = x.shape_of();
    s.dims[size_t(s.ndim - 1)] = w.size(0);
    return std::vector<OutputSpec>{{"y", s, x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    const double rows = double(x.rows()), out = double(w.size(0));
    return Cost{bytes_of(x) + bytes_of(w) + bytes_or_zero(a, "b") + rows * out * double(x.itemsize()),
                2.0 * rows * out * double(x.size(-1))};
  };
  op.cases = linear_cases;
  reg.add_kernel<Linear>(reference_desc(), &linear_reference);
  reg.add_kernel<Linear>(gemm_desc("OpenBLAS sgemm; bf16/f16 widened to f32 panels"),
                         &linear_cpu, &linear_cpu_applicable);

  OpEntry& bwd = reg.add_op<LinearBackward>();
  bwd.outputs = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w");
    return std::vector<OutputSpec>{{"dx", x.shape_of(), x.dtype},
                                   {"dw", w.shape_of(), w.dtype},
                                   {"db", Shape{w.size(0)}, w.dtype}};
  };
  bwd.cost = [](const ArgList& a) {
    const TensorView &x = a.tensor("x"), &w = a.tensor("w"), &dy = a.tensor("dy");
    const double flops = 4.0 * double(x.rows()) * double(w.size(0)) * double(x.size(-1));
    return Cost{bytes_of(dy) + 2 * bytes_of(x) + 2 * bytes_of(w) + double(w.size(0) * w.itemsize()),
                flops};
  };
  bwd.cases = linear_backward_cases;
  reg.add_kernel<LinearBackward>(reference_desc(), &linear_backward_reference);
  reg.add_kernel<LinearBackward>(
      gemm_desc("OpenBLAS sgemm for dx and dw; db in fixed row order"), &linear_backward_cpu,
      &linear_backward_cpu_applicable);
}

// fused_linear_cross_entropy's outputs (loss, lse), its backward's (dhidden, dw, db), and the cost
// of the ops that compute the gradient: three GEMMs of 2 N V H and `per_logit` flops a logit.
std::vector<OutputSpec> flce_loss_outputs(const ArgList& a) {
  const TensorView& hidden = a.tensor("hidden");
  const Reduction r = parse_reduction(a.op(), a.str("reduction"));
  return {{"loss", loss_shape(hidden, r), loss_dtype(hidden)}, {"lse", Shape{hidden.size(0)}, loss_dtype(hidden)}};
}
std::vector<OutputSpec> flce_gradient_outputs(const ArgList& a) {
  const TensorView &hidden = a.tensor("hidden"), &w = a.tensor("w");
  return {{"dhidden", hidden.shape_of(), hidden.dtype}, {"dw", w.shape_of(), w.dtype}, {"db", Shape{w.size(0)}, w.dtype}};
}
Cost flce_gradient_cost(const ArgList& a, double per_logit) {
  const TensorView &hidden = a.tensor("hidden"), &w = a.tensor("w");
  const double nv = double(hidden.size(0)) * double(w.size(0));
  return Cost{2 * bytes_of(hidden) + 2 * bytes_of(w) + bytes_of(a.tensor("target")) +
                  double(w.size(0) * w.itemsize()) + bytes_or_zero(a, "b"),
              nv * (6.0 * double(hidden.size(1)) + per_logit)};
}

void register_flce_ops(Registry& reg) {
  OpEntry& op = reg.add_op<FusedLinearCrossEntropy>();
  op.outputs = flce_loss_outputs;
  op.cost = [](const ArgList& a) {
    const TensorView &hidden = a.tensor("hidden"), &w = a.tensor("w");
    const double nv = double(hidden.size(0)) * double(w.size(0));
    // GEMM 2*N*V*H, then max, exp and sum over each logit row (~4 per logit).
    return Cost{bytes_of(hidden) + bytes_of(w) + bytes_of(a.tensor("target")) + bytes_or_zero(a, "b"),
                nv * (2.0 * double(hidden.size(1)) + 4.0)};
  };
  op.cases = fused_linear_cross_entropy_cases;
  reg.add_kernel<FusedLinearCrossEntropy>(reference_desc(), &fused_linear_cross_entropy_reference);
  reg.add_kernel<FusedLinearCrossEntropy>(
      gemm_desc("token chunks: OpenBLAS sgemm logits + Highway online log-sum-exp"),
      &fused_linear_cross_entropy_cpu, &fused_linear_cross_entropy_cpu_applicable);

  OpEntry& bwd = reg.add_op<FusedLinearCrossEntropyBackward>();
  bwd.outputs = flce_gradient_outputs;
  // Logits again (2NVH), dhidden (2NVH), dw (2NVH), softmax gradient (~6 per logit).
  bwd.cost = [](const ArgList& a) { return flce_gradient_cost(a, 6.0); };
  bwd.cases = fused_linear_cross_entropy_backward_cases;
  reg.add_kernel<FusedLinearCrossEntropyBackward>(reference_desc(),
                                                  &fused_linear_cross_entropy_backward_reference);
  reg.add_kernel<FusedLinearCrossEntropyBackward>(
      gemm_desc("token chunks: logits recomputed, gradient in place, sgemm into dhidden / dw"),
      &fused_linear_cross_entropy_backward_cpu,
      &fused_linear_cross_entropy_backward_cpu_applicable);
}

// Both in one call: the forward's outputs and the backward's, the three GEMMs of the unfused form
// (logits once: what a kernel that keeps a token block's whole row of logits does).
void register_flce_with_grad_op(Registry& reg) {
  OpEntry& op = reg.add_op<FusedLinearCrossEntropyWithGrad>();
  op.outputs = [](const ArgList& a) {
    std::vector<OutputSpec> out = flce_loss_outputs(a);
    for (OutputSpec& g : flce_gradient_outputs(a)) out.push_back(std::move(g));
    return out;
  };
  // Logits, dhidden and dw (2NVH each), statistics and gradient (~10 per logit).
  op.cost = [](const ArgList& a) { return flce_gradient_cost(a, 10.0); };
  op.cases = fused_linear_cross_entropy_with_grad_cases;
  reg.add_kernel<FusedLinearCrossEntropyWithGrad>(reference_desc(),
                                                  &fused_linear_cross_entropy_with_grad_reference);
  reg.add_kernel<FusedLinearCrossEntropyWithGrad>(
      gemm_desc("the cpu forward, then the cpu backward from the lse just written"),
      &fused_linear_cross_entropy_with_grad_cpu, &fused_linear_cross_entropy_with_grad_cpu_applicable);
}

}  // namespace

void register_linear(Registry& reg) {
  register_linear_ops(reg);
  register_flce_ops(reg);
  register_flce_with_grad_op(reg);
}

}  // namespace opforge
