// Softmax family: checks, shape functions, cost models and registration (ops/softmax/softmax.h).
#include "opforge/checks.h"
#include "ops/softmax/internal.h"

namespace opforge {

namespace {

// A row tensor with the reference's dtype, shape and device.
void check_like(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                const TensorView& ref) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, ref_arg, ref);
  expect_same_shape(op, arg, t, ref_arg, ref);
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, ref_arg, ref);
}

void check_forward(const char* op, const TensorView& y, const TensorView& x) {
  expect_row_tensor(op, "x", x);
  check_like(op, "y", y, "x", x);
  expect_no_overlap(op, "y", y, "x", x, Aliasing::exact);
}

void check_backward(const char* op, const TensorView& dx, const TensorView& dy,
                    const TensorView& y) {
  expect_row_tensor(op, "y", y);
  check_like(op, "dy", dy, "y", y);
  check_like(op, "dx", dx, "y", y);
  expect_no_overlap(op, "dx", dx, "dy", dy, Aliasing::exact);
  expect_no_overlap(op, "dx", dx, "y", y);
}

}  // namespace

void Softmax::check(const TensorView& y, const TensorView& x) { check_forward(name, y, x); }
void LogSoftmax::check(const TensorView& y, const TensorView& x) { check_forward(name, y, x); }
void Sparsemax::check(const TensorView& y, const TensorView& x) { check_forward(name, y, x); }
void SoftmaxBackward::check(const TensorView& dx, const TensorView& dy, const TensorView& y) {
  check_backward(name, dx, dy, y);
}
void LogSoftmaxBackward::check(const TensorView& dx, const TensorView& dy, const TensorView& y) {
  check_backward(name, dx, dy, y);
}
void SparsemaxBackward::check(const TensorView& dx, const TensorView& dy, const TensorView& y) {
  check_backward(name, dx, dy, y);
}

namespace {

// Flops per element. softmax: max 1, sub 1, exp ~10 (a polynomial), sum 1, scale 1.
// log_softmax: max, sub, exp, sum, sub. sparsemax: a few compare-and-sum sweeps (~3 x 2).
// Backward: two multiply-adds (softmax), exp + mul-add (log_softmax), compare + sub (sparsemax).
constexpr double kSoftmaxFlops = 14, kLogSoftmaxFlops = 14, kSparsemaxFlops = 8;
constexpr double kSoftmaxBackwardFlops = 4, kLogSoftmaxBackwardFlops = 12,
                 kSparsemaxBackwardFlops = 4;

template <class Op>
void register_forward(Registry& reg, std::vector<Case> (*cases)(), double flops,
                      void (*reference)(const Context&, const TensorView&, const TensorView&),
                      void (*cpu)(const Context&, const TensorView&, const TensorView&),
                      const char* summary) {
  OpEntry& op = reg.add_op<Op>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"y", x.shape_of(), x.dtype}};
  };
  op.cost = [flops](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return Cost{2 * bytes_of(x), flops * double(x.numel())};  // read x, write y
  };
  op.cases = cases;
  reg.add_kernel<Op>(reference_kernel_desc("plain loops, double accumulation", true), reference);
  reg.add_kernel<Op>(cpu_kernel_desc(summary, true), cpu, &softmax_forward_cpu_applicable);
}

template <class Op>
void register_backward(Registry& reg, std::vector<Case> (*cases)(), double flops,
                       void (*reference)(const Context&, const TensorView&, const TensorView&,
                                         const TensorView&),
                       void (*cpu)(const Context&, const TensorView&, const TensorView&,
                                   const TensorView&),
                       const char* summary) {
  OpEntry& op = reg.add_op<Op>();
  op.outputs = [](const ArgList& a) {
    const TensorView& y = a.tensor("y");
    return std::vector<OutputSpec>{{"dx", y.shape_of(), y.dtype}};
  };
  op.cost = [flops](const ArgList& a) {
    const TensorView& y = a.tensor("y");
    return Cost{3 * bytes_of(y), flops * double(y.numel())};  // read dy, y; write dx
  };
  op.cases = cases;
  reg.add_kernel<Op>(reference_kernel_desc("plain loops, double accumulation", true), reference);
  reg.add_kernel<Op>(cpu_kernel_desc(summary, true), cpu, &softmax_backward_cpu_applicable);
}

}  // namespace

void register_softmax(Registry& reg) {
  register_forward<Softmax>(reg, softmax_forward_cases, kSoftmaxFlops, &softmax_reference,
                            &softmax_cpu,
                            "Highway + OpenMP; one read of x, online max/sum per L1 block, "
                            "one vector exp per element");
  register_backward<SoftmaxBackward>(reg, softmax_backward_cases, kSoftmaxBackwardFlops,
                                     &softmax_backward_reference, &softmax_backward_cpu,
                                     "Highway + OpenMP; dot(dy, y) then one fused sweep");
  register_forward<LogSoftmax>(reg, softmax_forward_cases, kLogSoftmaxFlops,
                               &log_softmax_reference, &log_softmax_cpu,
                               "Highway + OpenMP; online max/sum per L1 block, then x - lse");
  register_backward<LogSoftmaxBackward>(reg, log_softmax_backward_cases, kLogSoftmaxBackwardFlops,
                                        &log_softmax_backward_reference, &log_softmax_backward_cpu,
                                        "Highway + OpenMP; sum(dy) then dy - exp(y) * sum");
  register_forward<Sparsemax>(reg, sparsemax_forward_cases, kSparsemaxFlops, &sparsemax_reference,
                              &sparsemax_cpu,
                              "Highway + OpenMP; tau by Michelot's fixed point on an f32 row copy");
  register_backward<SparsemaxBackward>(reg, sparsemax_backward_cases, kSparsemaxBackwardFlops,
                                       &sparsemax_backward_reference, &sparsemax_backward_cpu,
                                       "Highway + OpenMP; support mean of dy, then one sweep");
}

}  // namespace opforge
