// check --fuzz (Note [fuzz derivation], src/harness/fuzz.cpp): draws are reproducible, keep the
// extents of a case consistent, catch a kernel wrong off the declared shapes, and fail a kernel
// that accepts what the reference rejects.
#include <gtest/gtest.h>

#include <set>

#include "harness/fuzz.h"
#include "opforge/harness.h"
#include "tests/toy_ops.h"

namespace {

using namespace opforge;
using harness::detail::fuzz_case;
using harness::detail::kFuzzMaxElements;

const TensorInit& tensor_arg(const Case& c, const std::string& name) {
  for (const CaseArg& a : c.args)
    if (a.name == name) return std::get<TensorInit>(a.init);
  throw std::runtime_error("no tensor " + name);
}

int64_t int_arg(const Case& c, const std::string& name) {
  for (const CaseArg& a : c.args)
    if (a.name == name) return std::get<int64_t>(std::get<Value>(a.init));
  throw std::runtime_error("no scalar " + name);
}

// x [T, H], w [H], head = H, ids in [0, H), offsets {0, T} (a value list of length 2).
Case rows_case() {
  Case c{"5x12", CaseGroup::small, {}};
  c.args.push_back({"x", TensorInit{Shape{5, 12}}});
  c.args.push_back({"w", TensorInit{Shape{12}}});
  TensorInit ids{Shape{5}, Fill::integers};
  ids.high = 12;
  c.args.push_back({"ids", ids});
  TensorInit offsets{Shape{2}, Fill::values};
  offsets.values = {0, 5};
  c.args.push_back({"offsets", offsets});
  c.args.push_back({"head", Value(int64_t(12))});
  return c;
}

std::string shapes_of(const Case& c) {
  std::string s = c.label;
  for (const CaseArg& a : c.args)
    if (const auto* t = std::get_if<TensorInit>(&a.init)) s += " " + t->shape.str() + "/" + std::to_string(t->row_pad);
  return s;
}

TEST(HarnessFuzz, DrawsAreDeterministicPerSeedAndIndex) {
  const Case base = rows_case();
  const std::vector<const Case*> bases{&base};
  std::vector<std::string> a, b, other;
  for (int i = 0; i < 20; ++i) {
    a.push_back(shapes_of(fuzz_case(bases, 7, "op", i)));
    b.push_back(shapes_of(fuzz_case(bases, 7, "op", i)));
    other.push_back(shapes_of(fuzz_case(bases, 8, "op", i)));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);  // the seed matters
  // Draw i does not depend on how many draws a run asks for: check_ops' list equals the draws.
  Registry reg;
  toy::add_scale2(reg, "good", &toy::scale2_good);
  harness::Options opt;
  opt.fuzz = 12;
  opt.fuzz_seed = 99;
  std::vector<Case> twelve = harness::detail::fuzz_cases(opt, reg.op("scale2"));
  opt.fuzz = 4;
  std::vector<Case> four = harness::detail::fuzz_cases(opt, reg.op("scale2"));
  ASSERT_EQ(twelve.size(), 12u);
  ASSERT_EQ(four.size(), 4u);
  for (size_t i = 0; i < four.size(); ++i) EXPECT_EQ(shapes_of(four[i]), shapes_of(twelve[i]));
  // The label names the draw, its base and its shapes.
  EXPECT_EQ(twelve[3].label.rfind("fuzz3<-", 0), 0u) << twelve[3].label;
  EXPECT_NE(twelve[3].label.find(": x "), std::string::npos) << twelve[3].label;
}

TEST(HarnessFuzz, RemappedExtentsStayConsistent) {
  const Case base = rows_case();
  const std::vector<const Case*> bases{&base};
  int t_moved = 0, h_moved = 0;
  for (int i = 0; i < 200; ++i) {
    const Case c = fuzz_case(bases, 1, "op", i);
    const Shape& x = tensor_arg(c, "x").shape;
    ASSERT_EQ(x.ndim, 2);
    EXPECT_EQ(tensor_arg(c, "w").shape, Shape{x[1]}) << c.label;
    EXPECT_EQ(tensor_arg(c, "ids").shape, Shape{x[0]}) << c.label;
    EXPECT_EQ(int_arg(c, "head"), x[1]) << c.label;             // an integer scalar equal to H follows it
    EXPECT_EQ(tensor_arg(c, "ids").high, double(x[1])) << c.label;  // ids stay below the new H
    const TensorInit& offsets = tensor_arg(c, "offsets");
    EXPECT_EQ(offsets.shape, Shape{2}) << c.label;  // a value list keeps its length
    EXPECT_EQ(offsets.values, (std::vector<double>{0, double(x[0])})) << c.label;  // T follows
    EXPECT_LE(x.numel(), kFuzzMaxElements);
    t_moved += x[0] != 5;
    h_moved += x[1] != 12;
  }
  // About half the draws move each extent (kept with probability 1/2, new values may repeat it).
  EXPECT_GT(t_moved, 50);
  EXPECT_GT(h_moved, 50);
  EXPECT_LT(t_moved, 150);
}

harness::Report fuzz_run(Registry& reg, const std::string& impl, int draws, harness::Options opt = {}) {
  opt.backends = {impl};
  opt.fuzz = draws;
  return harness::run_test(reg, opt);
}

std::string first_failure(const harness::Report& r) {
  for (const auto& x : r.results)
    if (x.status == harness::Status::fail) return x.case_label + ": " + x.detail;
  return "";
}

TEST(HarnessFuzz, CatchesAKernelWrongOffTheDeclaredShapes) {
  Registry reg;
  toy::add_scale2(reg, "wrong_past_40", &toy::scale2_wrong_past_40);
  harness::Options declared;
  declared.backends = {"wrong_past_40"};
  EXPECT_TRUE(harness::run_test(reg, declared).ok());  // every declared case passes
  harness::Report r = fuzz_run(reg, "wrong_past_40", 30);
  EXPECT_GT(r.count(harness::Status::fail), 0);
  EXPECT_NE(first_failure(r).find("atol"), std::string::npos) << first_failure(r);
  EXPECT_NE(first_failure(r).find("fuzz"), std::string::npos) << first_failure(r);
  EXPECT_NE(harness::format_table(r).find("fuzz draws: "), std::string::npos);
}

TEST(HarnessFuzz, AKernelMustRejectWhatTheReferenceRejects) {
  // The reference refuses more than 40 elements; scale2's check does not.
  Registry reg;
  toy::add_scale2(reg, "lenient", &toy::scale2_good, nullptr, 100, &toy::scale2_reference_upto_40);
  toy::add_scale2(reg, "strict", &toy::scale2_reference_upto_40, nullptr, 90);
  toy::add_scale2(reg, "writes_first", &toy::scale2_writes_then_rejects, nullptr, 80);

  harness::Report lenient = fuzz_run(reg, "lenient", 30);
  EXPECT_GT(lenient.count(harness::Status::fail), 0);
  EXPECT_NE(first_failure(lenient).find("accepted a draw the reference rejects"), std::string::npos)
      << first_failure(lenient);

  harness::Report strict = fuzz_run(reg, "strict", 30);
  EXPECT_TRUE(strict.ok()) << first_failure(strict);
  int rejected = 0;
  for (const auto& x : strict.results) rejected += x.rejected;
  EXPECT_GT(rejected, 0);
  EXPECT_LT(rejected, 30);  // and some draws are valid
  EXPECT_NE(harness::format_table(strict).find("rejected (by the reference)"), std::string::npos);

  harness::Report writes = fuzz_run(reg, "writes_first", 30);
  EXPECT_NE(first_failure(writes).find("rejected the draw but wrote 'y' first"), std::string::npos)
      << first_failure(writes);
}

}  // namespace
