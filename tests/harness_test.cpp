// The harness must catch faulty kernels: a small numeric error, an unwritten element, an
// out-of-bounds write, a write to an input; and must pass a correct kernel.
#include <gtest/gtest.h>

#include "opforge/harness.h"
#include "tests/toy_ops.h"

namespace {

using namespace opforge;

harness::Report run_test_with(const std::string& impl, OpTraits<toy::Scale2>::Kernel* fn) {
  Registry reg;
  toy::add_scale2(reg, impl, fn);
  harness::Options opt;
  opt.backends = {impl};
  return harness::run_test(reg, opt);
}

std::string first_failure(const harness::Report& r) {
  for (const auto& x : r.results)
    if (x.status == harness::Status::fail) return x.detail;
  return "";
}

TEST(Harness, PassesACorrectKernel) {
  harness::Report r = run_test_with("good", &toy::scale2_good);
  EXPECT_EQ(r.count(harness::Status::fail), 0) << first_failure(r);
  EXPECT_EQ(r.count(harness::Status::pass), 3);  // three cases, f32
}

TEST(Harness, CatchesASlightlyWrongKernel) {
  harness::Report r = run_test_with("wrong", &toy::scale2_slightly_wrong);
  EXPECT_GT(r.count(harness::Status::fail), 0);
  EXPECT_NE(first_failure(r).find("atol"), std::string::npos) << first_failure(r);
}

TEST(Harness, CatchesAnUnwrittenElement) {
  harness::Report r = run_test_with("unwritten", &toy::scale2_unwritten);
  EXPECT_GT(r.count(harness::Status::fail), 0);
  EXPECT_NE(first_failure(r).find("not written"), std::string::npos) << first_failure(r);
}

TEST(Harness, CatchesAnOutOfBoundsWrite) {
  harness::Report r = run_test_with("oob", &toy::scale2_out_of_bounds);
  EXPECT_GT(r.count(harness::Status::fail), 0);
  EXPECT_NE(first_failure(r).find("out-of-bounds"), std::string::npos) << first_failure(r);
}

TEST(Harness, CatchesAWriteToAnInput) {
  harness::Report r = run_test_with("writes_input", &toy::scale2_writes_input);
  EXPECT_GT(r.count(harness::Status::fail), 0);
  EXPECT_NE(first_failure(r).find("was modified"), std::string::npos) << first_failure(r);
}

TEST(Harness, ReportsInapplicableCasesAsSkipped) {
  Registry reg;
  toy::add_scale2(reg, "even", &toy::scale2_good, &toy::even_only);
  harness::Options opt;
  opt.backends = {"even"};
  harness::Report r = harness::run_test(reg, opt);
  EXPECT_EQ(r.count(harness::Status::fail), 0);
  EXPECT_EQ(r.count(harness::Status::skip), 1);  // 3x5 is odd; 0x5 has 0 elements (even)
}

TEST(Harness, PerfReportsTimesAndCeiling) {
  Registry reg;
  toy::add_scale2(reg, "good", &toy::scale2_good);
  harness::Options opt;
  opt.groups = {CaseGroup::small};
  opt.perf_min_seconds = 0.001;
  harness::Report r = harness::run_perf(reg, opt);
  ASSERT_EQ(r.results.size(), 2u);  // reference and good, f32
  EXPECT_GT(r.cpu_copy_gbps, 0.1);
  for (const auto& x : r.results) {
    EXPECT_EQ(x.status, harness::Status::pass) << x.detail;
    EXPECT_GT(x.median_us, 0);
    EXPECT_DOUBLE_EQ(x.bytes, 4 * 8 * 8.0);
  }
}

}  // namespace

// Note [perf inputs]: perf-mode inputs follow each fill rule, in the dtype, reproducibly, and
// blocks filled in parallel do not repeat one another.
#include "harness/materialize.h"

namespace {

TEST(PerfInputs, FollowTheFillRuleInTheDtype) {
  using opforge::harness::detail::fill_for_perf;
  const int64_t n = (int64_t(1) << 17) + 3;  // three blocks, the last one short
  TensorInit ids;
  ids.shape = Shape{n};
  ids.fill = Fill::integers;
  ids.low = 5;
  ids.high = 9;
  std::vector<int32_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  fill_for_perf(a.data(), ids, DType::i32, 42);
  fill_for_perf(b.data(), ids, DType::i32, 42);
  EXPECT_EQ(a, b);
  std::vector<int> seen(9, 0);
  for (int32_t v : a) {
    ASSERT_GE(v, 5);
    ASSERT_LT(v, 9);
    ++seen[size_t(v)];
  }
  for (int v = 5; v < 9; ++v) EXPECT_GT(seen[size_t(v)], n / 8) << v;

  TensorInit cycle;
  cycle.shape = Shape{7};
  cycle.fill = Fill::values;
  cycle.values = {0, 3, 10};
  std::vector<int64_t> c(7);
  fill_for_perf(c.data(), cycle, DType::i64, 1);
  EXPECT_EQ(c, (std::vector<int64_t>{0, 3, 10, 0, 3, 10, 0}));

  TensorInit normal;
  normal.shape = Shape{n};
  normal.fill = Fill::normal;
  std::vector<uint16_t> h(static_cast<size_t>(n));
  fill_for_perf(h.data(), normal, DType::bf16, 7);
  double sum = 0, sq = 0;
  for (uint16_t x : h) {
    const double v = bf16_to_f32(x);
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / double(n), 0.0, 0.02);
  EXPECT_NEAR(sq / double(n), 1.0, 0.03);
  EXPECT_FALSE(std::equal(h.begin(), h.begin() + (1 << 16), h.begin() + (1 << 16)));  // blocks differ

  TensorInit empty;
  empty.shape = Shape{3};
  empty.fill = Fill::values;
  EXPECT_THROW(fill_for_perf(h.data(), empty, DType::bf16, 1), Error);
}

}  // namespace

// The training group (training-step shapes, minutes a call on a CPU) runs only when named: by
// --group training or by a case label; no default selection of check or bench includes it.
#include "harness/instance.h"

namespace {

TEST(HarnessSelection, TrainingCasesRunOnlyWhenNamed) {
  using opforge::CaseGroup;
  using opforge::harness::detail::case_selected;
  using opforge::harness::detail::group_selected;
  opforge::harness::Options opt;
  EXPECT_FALSE(group_selected(opt, CaseGroup::training, false));
  EXPECT_FALSE(group_selected(opt, CaseGroup::training, true));
  EXPECT_TRUE(group_selected(opt, CaseGroup::large, true));
  EXPECT_FALSE(group_selected(opt, CaseGroup::large, false));
  EXPECT_TRUE(group_selected(opt, CaseGroup::small, false));
  opt.groups = {CaseGroup::training};
  EXPECT_TRUE(group_selected(opt, CaseGroup::training, true));
  EXPECT_TRUE(group_selected(opt, CaseGroup::training, false));
  EXPECT_FALSE(group_selected(opt, CaseGroup::large, true));
  opforge::Case c;
  c.label = "t8192xv128256";
  c.group = CaseGroup::training;
  opforge::harness::Options named;
  EXPECT_FALSE(case_selected(named, c, true));
  named.cases = {"t8192xv128256"};
  EXPECT_TRUE(case_selected(named, c, true));
  EXPECT_STREQ(opforge::case_group_name(CaseGroup::training), "training");
}

}  // namespace

// --shard K/N: every op of the real registry is in exactly one shard, and an op's shard is fixed
// by its name (FNV-1a), so every run and machine splits the catalogue alike.
#include "opforge/registry.h"

namespace {

TEST(HarnessSelection, ShardsPartitionTheOps) {
  using opforge::harness::detail::op_selected;
  using opforge::harness::detail::op_shard;
  EXPECT_EQ(op_shard("rms_norm", 4), 0);  // the 64-bit FNV-1a of "rms_norm" modulo 4 and 7
  EXPECT_EQ(op_shard("rms_norm", 7), 4);
  const opforge::Registry& reg = opforge::global_registry();
  ASSERT_GT(reg.ops().size(), 8u);
  std::vector<int> per_shard(4, 0);
  for (const opforge::OpEntry* op : reg.ops()) {
    int owners = 0;
    for (int k = 0; k < 4; ++k) {
      opforge::harness::Options opt;
      opt.shard_index = k, opt.shard_count = 4;
      if (op_selected(opt, *op)) ++owners, ++per_shard[size_t(k)];
    }
    EXPECT_EQ(owners, 1) << op->name;
  }
  for (int n : per_shard) EXPECT_GT(n, 0);  // no empty shard in the catalogue
  opforge::harness::Options named;  // a named op outside the shard is not run by it
  named.ops = {"rms_norm"};
  named.shard_index = 1, named.shard_count = 4;
  EXPECT_FALSE(op_selected(named, reg.op("rms_norm")));
  named.shard_index = 0;
  EXPECT_TRUE(op_selected(named, reg.op("rms_norm")));
}

}  // namespace
