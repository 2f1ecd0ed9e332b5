// Communication family: checks, shape function, cost model, cases and registration (comm.h).
#include <string>
#include <utility>
#include <vector>

#include "opforge/checks.h"
#include "opforge/error.h"
#include "ops/comm/comm.h"

namespace opforge {

void AllReduce::check(const TensorView& y, const TensorView& x) {
  expect_defined(name, "x", x);
  expect_floating(name, "x", x);
  expect_min_ndim(name, "x", x, 1);
  if (x.size(0) < 1) throw_argument_error(name, "x", "at least one rank in dim 0", x.str());
  // Contiguous (an empty tensor has no layout to speak of).
  if (x.numel() > 0 && !x.is_contiguous()) throw_argument_error(name, "x", "a contiguous tensor", x.str());
  expect_defined(name, "y", y);
  expect_same_dtype(name, "y", y, "x", x);
  expect_same_shape(name, "y", y, "x", x);
  if (y.numel() > 0 && !y.is_contiguous()) throw_argument_error(name, "y", "a contiguous tensor", y.str());
  expect_same_device(name, "y", y, "x", x);
  expect_no_overlap(name, "y", y, "x", x);
}

namespace {

// x: [ranks] + rest, filled with normal values (sums of outliers would test cancellation, not the
// collective).
Case all_reduce_case(std::string label, CaseGroup group, Shape x_shape) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  TensorInit x;
  x.shape = x_shape;
  x.fill = Fill::normal;
  c.args.push_back({"x", x});
  return c;
}

std::vector<Case> all_reduce_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, Shape s) {
    cases.push_back(all_reduce_case(std::move(label), group, s));
  };
  add("r1_n8", CaseGroup::small, {1, 8});
  add("r2_n7", CaseGroup::small, {2, 7});
  add("r2_3x5", CaseGroup::small, {2, 3, 5});
  add("r4_n33", CaseGroup::small, {4, 33});
  add("r2_t64xh4096", CaseGroup::medium, {2, 64, 4096});
  add("r4_n4099", CaseGroup::medium, {4, 4099});
  add("r8_n1000", CaseGroup::medium, {8, 1000});
  // One hidden row per token of a tensor-parallel layer's output (hidden 4096), two ranks.
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("r2_t" + std::to_string(tokens) + "xh4096", CaseGroup::large, {2, tokens, 4096});
  add("r2_n0", CaseGroup::edge, {2, 0});
  add("r1_n1", CaseGroup::edge, {1, 1});
  add("r3_n1", CaseGroup::edge, {3, 1});
  add("r2_n4097", CaseGroup::edge, {2, 4097});
  return cases;
}

}  // namespace

void register_comm(Registry& reg) {
  OpEntry& op = reg.add_op<AllReduce>();
  op.outputs = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    return std::vector<OutputSpec>{{"y", x.shape_of(), x.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView& x = a.tensor("x");
    // Reads every rank's buffer and writes every rank's result; one add per element per extra rank.
    // Bytes over the links (2 (ranks - 1) / ranks of a buffer per rank on a ring) are not memory
    // traffic: collect-comm reports them as NCCL's bus bandwidth.
    const double ranks = double(x.size(0));
    return Cost{2.0 * bytes_of(x), ranks > 0 ? double(x.numel()) / ranks * (ranks - 1) : 0.0};
  };
  op.cases = all_reduce_cases;
  reg.add_kernel<AllReduce>(reference_kernel_desc("plain loops, rank-order sums in double"),
                            &all_reduce_reference);
}

}  // namespace opforge
