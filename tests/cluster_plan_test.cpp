// The launch plans of the few-row thread-block clusters, checked on the host: the norm family's
// backward (ops/norm/cluster_plan.h) and the softmax family's (ops/softmax/cluster_plan.h). The
// kernels trust them for their shared-memory bounds (at most 1,024 threads and two rows a thread
// in the norm clusters) and for covering every pack of a row.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "ops/norm/cluster_plan.h"
#include "ops/softmax/cluster_plan.h"

namespace opforge {
namespace {

using cuda::norm::bwd_cluster_plan;
using cuda::norm::ClusterPlan;

void expect_plan(const ClusterPlan& c, int ranks, int packs, int padded, int groups, int rows_per_thread) {
  EXPECT_EQ(c.ranks, ranks);
  EXPECT_EQ(c.packs, packs);
  EXPECT_EQ(c.padded, padded);
  EXPECT_EQ(c.groups, groups);
  EXPECT_EQ(c.rows_per_thread, rows_per_thread);
}

TEST(ClusterPlan, NormBackwardShapes) {
  // Hidden 4,096 bf16 (512 packs), 16 tokens: 16 CTAs of one warp's width of packs and 16 row
  // groups, or 8 CTAs of 64 packs.
  expect_plan(bwd_cluster_plan(16, 512, 16), 16, 32, 32, 16, 1);
  expect_plan(bwd_cluster_plan(16, 512, 8), 8, 64, 64, 16, 1);
  expect_plan(bwd_cluster_plan(32, 512, 8), 8, 64, 64, 16, 2);
  expect_plan(bwd_cluster_plan(33, 512, 16), 16, 32, 32, 32, 2);
  EXPECT_EQ(bwd_cluster_plan(33, 512, 8).ranks, 0);  // three rows a thread
  // Short rows take fewer CTAs (a warp's width of packs each); a ragged last CTA.
  expect_plan(bwd_cluster_plan(1, 128, 8), 4, 32, 32, 1, 1);
  expect_plan(bwd_cluster_plan(3, 1, 16), 1, 1, 32, 3, 1);
  expect_plan(bwd_cluster_plan(5, 1000, 8), 8, 125, 128, 5, 1);
  // No rows, or a row longer than the CTAs hold: no plan.
  EXPECT_EQ(bwd_cluster_plan(0, 512, 8).ranks, 0);
  EXPECT_EQ(bwd_cluster_plan(16, 16384, 8).ranks, 0);   // 2,048 packs a CTA
  EXPECT_EQ(bwd_cluster_plan(16, 16384, 16).ranks, 0);  // 1,024 packs a CTA, one row group
}

TEST(ClusterPlan, NormBackwardInvariants) {
  for (int most : {8, 16})
    for (int64_t n_packs : {1, 7, 31, 64, 100, 512, 513, 1000, 1024, 2048, 4096, 8192})
      for (int64_t rows = 1; rows <= 70; ++rows) {
        SCOPED_TRACE(std::to_string(most) + " CTAs, " + std::to_string(rows) + " x " + std::to_string(n_packs));
        const ClusterPlan c = bwd_cluster_plan(rows, n_packs, most);
        if (c.ranks == 0) continue;
        EXPECT_LE(c.ranks, most);
        EXPECT_EQ(c.ranks & (c.ranks - 1), 0);                    // a power of two
        EXPECT_TRUE(c.ranks == 1 || n_packs >= int64_t(c.ranks) * 32);
        EXPECT_GE(int64_t(c.ranks) * c.packs, n_packs);           // every pack has a CTA
        EXPECT_EQ(c.padded % 32, 0);
        EXPECT_GE(c.padded, c.packs);
        EXPECT_LE(c.groups * c.padded, cuda::norm::kClusterMaxThreads);
        EXPECT_LE(c.rows_per_thread, 2);
        EXPECT_GE(int64_t(c.groups) * c.rows_per_thread, rows);  // every row has a slot
        EXPECT_LE(int64_t(c.groups) * c.rows_per_thread, cuda::norm::kClusterMaxRows);
      }
}

TEST(ClusterPlan, SoftmaxFewRows) {
  using cuda::softmax::few_row_plan;
  constexpr int kSms = 132;  // an H100 SXM / H200
  auto expect = [](cuda::softmax::FewRowPlan p, int units, int ranks) {
    EXPECT_EQ(p.units_per_thread, units);
    EXPECT_EQ(p.ranks, ranks);
  };
  // bf16 rows in 16-byte units (8 elements): 128,256 -> 16,032 units; 32,000 -> 4,000; 4,096 -> 512.
  expect(few_row_plan(16, 16032, kSms, true), 4, 16);  // 256 CTAs of 4 units: two an SM
  expect(few_row_plan(1, 16032, kSms, true), 4, 16);   // 16 CTAs, each an SM of its own
  expect(few_row_plan(8, 16032, kSms, true), 4, 16);   // 128 CTAs
  expect(few_row_plan(17, 16032, kSms, true), 8, 8);   // 272 CTAs of 16 would not fit two an SM
  expect(few_row_plan(16, 4000, kSms, true), 4, 8);
  expect(few_row_plan(16, 4000, kSms, false), 8, 8);   // OPFORGE_CUDA_SOFTMAX_CLUSTER_UNITS=8
  expect(few_row_plan(16, 512, kSms, true), 4, 2);
  // Not taken: as many rows as SMs, a row longer than 8 CTAs of 8 units hold, or a row one CTA
  // holds with nothing to spread it over.
  expect(few_row_plan(132, 512, kSms, true), 0, 0);
  expect(few_row_plan(0, 512, kSms, true), 0, 0);
  expect(few_row_plan(16, 32768, kSms, true), 0, 0);
  expect(few_row_plan(1, 64, kSms, true), 0, 0);
  // Every plan holds the row and spreads no further than the SMs allow once it holds it.
  for (int64_t rows = 1; rows < kSms; ++rows)
    for (int64_t units : {int64_t(1), int64_t(100), int64_t(512), int64_t(4000), int64_t(16032), int64_t(16384)})
      for (bool four : {false, true}) {
        const cuda::softmax::FewRowPlan p = few_row_plan(rows, units, kSms, four);
        if (p.ranks == 0) continue;
        EXPECT_TRUE(p.units_per_thread == 8 || (four && p.units_per_thread == 4));
        EXPECT_GE(int64_t(p.ranks) * cuda::softmax::kClusterThreads * p.units_per_thread, units);
        EXPECT_GE(p.ranks, 2);
        EXPECT_LE(p.ranks, p.units_per_thread == 4 && rows * 16 <= 2 * kSms ? 16 : 8);
      }
}

TEST(ClusterPlan, HeldUnits) {
  using cuda::softmax::few_row_plan;
  using cuda::softmax::held_units;
  constexpr int kSms = 132;
  // 16 x 32,000 bf16: 8 CTAs of 500 units, 2 a thread; 16 x 128,256: 16 CTAs of 1,002, the plan's 4;
  // 8 x 40,000: 16 CTAs of 313; 16 x 4,096: 2 CTAs of 256.
  EXPECT_EQ(held_units(few_row_plan(16, 4000, kSms, true), 4000), 2);
  EXPECT_EQ(held_units(few_row_plan(16, 16032, kSms, true), 16032), 4);
  EXPECT_EQ(held_units(few_row_plan(20, 16032, kSms, true), 16032), 8);  // 8 CTAs of 2,004
  EXPECT_EQ(held_units(few_row_plan(8, 5000, kSms, true), 5000), 2);
  EXPECT_EQ(held_units(few_row_plan(16, 512, kSms, true), 512), 2);
  EXPECT_EQ(held_units(few_row_plan(1, 16032, kSms, true), 16032), 4);  // 16 CTAs of 1,002
  // Whatever it picks holds the segment and is never more than the plan's.
  for (int64_t rows = 1; rows < kSms; ++rows)
    for (int64_t units : {int64_t(100), int64_t(513), int64_t(1025), int64_t(4000), int64_t(9000), int64_t(16032)}) {
      const cuda::softmax::FewRowPlan p = few_row_plan(rows, units, kSms, true);
      if (p.ranks == 0) continue;
      const int held = held_units(p, units);
      EXPECT_TRUE(held == 2 || held == p.units_per_thread);
      EXPECT_LE(held, p.units_per_thread);
      EXPECT_GE(int64_t(held) * cuda::softmax::kClusterThreads, (units + p.ranks - 1) / p.ranks);
    }
}

TEST(ClusterPlan, ManyRows) {
  using cuda::softmax::many_row_plan;
  constexpr int kSms = 132;
  auto expect = [](cuda::softmax::FewRowPlan p, int units, int ranks) {
    EXPECT_EQ(p.units_per_thread, units);
    EXPECT_EQ(p.ranks, ranks);
  };
  // bf16 32,000 (4,000 units): 4 CTAs of 4 units; 128,256 (16,032): 8 CTAs of 8 units; f32 32,000
  // (8,000 units): 8 CTAs of 4 units.
  expect(many_row_plan(1024, 4000, kSms, 1024), 4, 4);
  expect(many_row_plan(256, 16032, kSms, 1024), 8, 8);
  expect(many_row_plan(1024, 8000, kSms, 1024), 4, 8);
  expect(many_row_plan(140, 1125, kSms, 1024), 4, 2);
  expect(many_row_plan(1024, 4000, kSms, 1024, false), 8, 2);  // OPFORGE_CUDA_SOFTMAX_CLUSTER_UNITS=8
  // Not taken: fewer rows than SMs, a row the row kernel holds, a row longer than 8 CTAs of 8 units.
  expect(many_row_plan(131, 4000, kSms, 1024), 0, 0);
  expect(many_row_plan(1024, 1024, kSms, 1024), 0, 0);
  expect(many_row_plan(1024, 16385, kSms, 1024), 0, 0);
  for (int64_t rows : {int64_t(132), int64_t(1000), int64_t(1) << 20})
    for (int64_t units = 1; units < 20000; units += 37) {
      const cuda::softmax::FewRowPlan p = many_row_plan(rows, units, kSms, 1024);
      if (p.ranks == 0) continue;
      EXPECT_GT(units, 1024);
      EXPECT_LE(p.ranks, 8);
      EXPECT_GE(int64_t(p.ranks) * 256 * p.units_per_thread, units);        // holds the row
      EXPECT_LT(int64_t(p.ranks) / 2 * 256 * p.units_per_thread, units);    // on the fewest CTAs
    }
}

TEST(ClusterPlan, RowPipeline) {
  constexpr int kSms = 132;
  constexpr int64_t kSmem = 227 * 1024 - 1024, kClusterUnits = 8 * 256 * 8;
  auto plan_in = [](int64_t rows, int64_t units, int64_t smem) {
    return cuda::softmax::pipeline_plan(rows, units, kSms, 1024, kClusterUnits, smem, 512, 8);
  };
  auto plan = [&](int64_t rows, int64_t units) { return plan_in(rows, units, kSmem); };
  auto expect = [](cuda::softmax::PipelinePlan p, int ranks, int stages, int64_t seg) {
    EXPECT_EQ(p.ranks, ranks);
    EXPECT_EQ(p.stages, stages);
    EXPECT_EQ(p.seg_units, seg);
  };
  // bf16 32,000 (4,000 packs, 64,000 bytes): one CTA a row, 2 stages. bf16 128,256 (16,032
  // packs) and f32 32,000 (8,000) need a cluster and the many-row cluster holds them: not taken.
  // f32 128,256 (32,064 packs): 8 CTAs of 4,008. 32,769 packs: no 8 CTAs hold them.
  expect(plan(1024, 4000), 1, 2, 4000);
  expect(plan(1024, 2000), 1, 2, 2000);
  expect(plan(256, 16032), 0, 0, 0);
  expect(plan(1024, 8000), 0, 0, 0);
  expect(plan(256, 32064), 8, 2, 4008);
  expect(plan(256, 16385), 8, 2, 2049);
  expect(plan(1024, 8 * 4096 + 1), 0, 0, 0);
  // Not taken: fewer rows than SMs, a row the row kernel holds, too little shared memory for two
  // stages on one CTA.
  expect(plan(131, 4000), 0, 0, 0);
  expect(plan(1024, 1024), 0, 0, 0);
  expect(plan_in(1024, 4000, 4000 * 16), 0, 0, 0);
  expect(plan_in(1024, 2000, 4000 * 16), 1, 2, 2000);
  for (int64_t units = 1025; units < 40000; units += 41) {
    const cuda::softmax::PipelinePlan p = plan(1 << 20, units);
    if (p.ranks == 0) {
      EXPECT_TRUE(units > 4096 && (units <= kClusterUnits || units > 8 * 4096)) << units;
      continue;
    }
    EXPECT_GE(p.seg_units * p.ranks, units);        // the segments cover the row
    EXPECT_LT(p.seg_units * (p.ranks - 1), units);  // and none is empty
    EXPECT_LE(p.seg_units, 512 * 8);                // a CTA holds its segment
    EXPECT_GE(p.stages, 2);
    EXPECT_LE(p.stages * p.seg_units * 16, kSmem);  // the ring fits
    EXPECT_TRUE(p.ranks == 1 || units > kClusterUnits);
  }
}
}  // namespace
}  // namespace opforge
