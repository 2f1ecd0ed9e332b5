// The busiest thread's rows in the performance database (Note [busiest thread's rows] in
// src/perfdb/internal.h): the threads read from a table's device header, a staircase line on
// which ceil(tokens / threads) gives the exact answer where the rule in tokens does not, queries
// that say so in `how`, a table whose rows vote the axis back (time smooth in tokens although
// split over threads), a device header without threads (a GPU) that keeps the old rule, and
// leave-one-out exact on the staircase.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "opforge/perfdb.h"
#include "opforge/plan.h"
#include "perfdb/internal.h"
#include "tests/perfdb_test_util.h"

using namespace opforge;
using namespace opforge::perfdb;

namespace {

// A kernel on 2 threads that splits from 2 rows on (2,000 bytes against a 2,000-byte threshold):
// one thread below, then as long as its busiest thread's ceil(tokens / 2) rows take, a fixed cost
// plus a constant time a row.
double stair_time(double x) { return x < 2 ? 0.8 + 0.6 * x : 1.0 + 0.5 * std::ceil(x / 2); }
// The same split, but time smooth in the tokens (the rows are not the tokens: a kernel that cuts
// tiles of elements over the threads).
double smooth_time(double x) { return x < 2 ? 0.8 + 0.6 * x : 1.0 + 0.25 * x; }
std::vector<plan::Decision> split_plan(double x) { return {{"threads", x >= 2, 1000 * x, 2000}}; }

OpTable table(const std::string& system, const std::vector<int64_t>& tokens, double (*time)(double),
              const std::string& device = "test cpu (2 threads)") {
  OpTable t = test_util::rms_norm_line(system, tokens, time, split_plan);
  t.header.device = device;
  return t;
}

}  // namespace

TEST(PerfdbBusiest, ThreadsComeFromTheDeviceHeader) {
  FileHeader h;
  for (const auto& [device, threads] : std::vector<std::pair<std::string, int>>{
           {"Intel(R) Xeon(R) Processor (2 threads)", 2},
           {"AMD EPYC 7B12 (1 thread)", 1},
           {"a box (64 threads)", 64},
           {"NVIDIA H200", 0},
           {"a box (two threads)", 0},
           {"a box (2 threads) spare", 0},
           {"a box (2 cores)", 0}}) {
    h.device = device;
    EXPECT_EQ(detail::device_threads(h), threads) << device;
  }
}

TEST(PerfdbBusiest, StaircaseLineIsExactAlongTheBusiestRows) {
  const std::vector<double> stored = {1, 2, 4, 6, 8, 12, 16, 32};
  std::vector<double> xs, ys;
  std::vector<std::vector<plan::Decision>> store;
  for (double x : stored) {
    xs.push_back(x);
    ys.push_back(stair_time(x));
    store.push_back(split_plan(x));
  }
  std::vector<detail::PlanRef> plans;
  for (const auto& p : store) plans.push_back(&p);
  // 3, 5 and 7 tokens: the same busiest rows as 4, 6 and 8 (a stored time); 10 and 20: between
  // stored busiest rows, where a fixed cost plus a power law is exact on the affine time.
  for (double x : {3.0, 5.0, 7.0, 10.0, 20.0}) {
    detail::LineNote note;
    const double y = detail::interp_line_planned(xs, ys, plans, x, Interpolation::floor_power, &note, 2, "tokens");
    EXPECT_NEAR(y / stair_time(x), 1.0, 1e-9) << x << ": " << note.plan;
    EXPECT_NE(note.plan.find("the busiest of 2 threads' rows ceil(tokens / 2) = " + fmt::format("{}", std::ceil(x / 2))),
              std::string::npos)
        << note.plan;
    EXPECT_EQ(note.stored, int(x) % 2 == 1) << x;
  }
  // The rule in tokens puts 3 tokens on a curve through 2 and 4 tokens, well below the stair.
  const double in_tokens = detail::interp_line_planned(xs, ys, plans, 3, Interpolation::floor_power);
  EXPECT_GT(std::abs(in_tokens / stair_time(3) - 1), 0.1) << in_tokens;
  // Past the switch between 1 and 4 tokens (2 left out), at one row a thread: the run continued
  // from 4 tokens along the busiest rows; at 3 tokens, 4's stored time.
  const std::vector<double> gx = {1, 4, 6, 8}, gy = {stair_time(1), stair_time(4), stair_time(6), stair_time(8)};
  const std::vector<detail::PlanRef> gp = {plans[0], plans[2], plans[3], plans[4]};
  detail::LineNote note;
  EXPECT_NEAR(detail::interp_line_planned(gx, gy, gp, 3, Interpolation::floor_power, &note, 2, "tokens"),
              stair_time(3), 1e-12);
  EXPECT_TRUE(note.stored);
  EXPECT_NE(note.plan.find("past the plan switch between 1 and 4"), std::string::npos) << note.plan;
  // Below one thread's worth of split rows the rows of the other plan answer, as before.
  EXPECT_EQ(detail::interp_line_planned(xs, ys, plans, 1.5, Interpolation::floor_power, nullptr, 2),
            detail::interp_line_planned(xs, ys, plans, 1.5, Interpolation::floor_power));
}

TEST(PerfdbBusiest, QueriesFollowTheStairWhereTheRowsVoteForIt) {
  test_util::ScratchFolder folder("perfdb_busiest_test");
  const std::string dir = folder.str();
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 6, 8, 12, 16, 32};
  write_table(table("stair", tokens, stair_time), dir + "/stair/rms_norm.csv");
  write_table(table("smooth", tokens, smooth_time), dir + "/smooth/rms_norm.csv");
  write_table(table("gpu", tokens, stair_time, "NVIDIA H200"), dir + "/gpu/rms_norm.csv");
  const Dims at5 = {{"tokens", 5}, {"hidden", 4096}};

  // The staircase: 3 and 4 tokens (stored) take the same time, so the vote keeps the busiest rows.
  Database stair = Database::load("stair", dir);
  Answer a = stair.query("rms_norm", "cpu", "bf16", at5);
  EXPECT_EQ(a.method, Method::interpolated);
  EXPECT_NEAR(a.us, stair_time(6), 1e-12);  // 5 tokens: 3 rows on the busiest thread, as at 6
  EXPECT_NE(a.how.find("busiest of 2 threads' rows ceil(tokens / 2) = 3 as stored"), std::string::npos) << a.how;
  for (Interpolation m : {Interpolation::monotone_cubic, Interpolation::log_linear}) {
    stair.set_interpolation(m);  // the vote runs again under the new rule
    EXPECT_NEAR(stair.query("rms_norm", "cpu", "bf16", at5).us, stair_time(6), 1e-12) << interpolation_name(m);
  }
  // Leave-one-out: every split row with a neighbour of the same busiest rows is exact, 3 and 4
  // tokens among them (each left out of the vote it is predicted under).
  stair.set_interpolation(Interpolation::floor_power);
  const std::vector<ValidationRow> loo = leave_one_out(stair);
  int exact = 0;
  for (const ValidationPoint& p : loo.at(0).interior) {
    if (p.where.find("tokens=3,") != std::string::npos || p.where.find("tokens=4,") != std::string::npos ||
        p.where.find("tokens=6,") != std::string::npos) {
      EXPECT_NEAR(p.predicted_us / p.measured_us, 1.0, 1e-9) << p.where;
      ++exact;
    }
  }
  EXPECT_EQ(exact, 3);

  // Time smooth in the tokens, the same plans: the rows vote the axis back, exact on the affine time.
  Answer s = Database::load("smooth", dir).query("rms_norm", "cpu", "bf16", at5);
  EXPECT_NEAR(s.us / smooth_time(5), 1.0, 1e-9) << s.how;
  EXPECT_EQ(s.how.find("busiest"), std::string::npos) << s.how;

  // A device that does not say its threads (a GPU): the rule in tokens, as before, off the stair.
  Answer g = Database::load("gpu", dir).query("rms_norm", "cpu", "bf16", at5);
  EXPECT_EQ(g.how.find("busiest"), std::string::npos) << g.how;
  EXPECT_GT(std::abs(g.us / stair_time(5) - 1), 0.05) << g.us;
}

TEST(PerfdbBusiest, VoteCountsOnlyRowsAmongTheirRunsRows) {
  // On the staircase without 3 tokens every split row is a multiple of 2: nothing to vote on.
  const std::vector<double> even = {1, 2, 4, 6, 8};
  std::vector<double> ys;
  std::vector<std::vector<plan::Decision>> store;
  for (double x : even) {
    ys.push_back(stair_time(x));
    store.push_back(split_plan(x));
  }
  std::vector<detail::PlanRef> plans;
  for (const auto& p : store) plans.push_back(&p);
  const detail::BusiestVote none = detail::busiest_vote(even, ys, plans, 2, Interpolation::floor_power);
  EXPECT_EQ(none.points, 0);
  EXPECT_TRUE(none.rows_win());  // the plan's word stands
  // With 3 tokens: 3 and 4 vote (one busiest row count, 2, within the rest of their run); 2
  // tokens (1 row, below every other row of its run) and rows where both axes agree do not.
  const std::vector<double> xs = {1, 2, 3, 4, 6, 8};
  ys.clear();
  store.clear();
  for (double x : xs) {
    ys.push_back(stair_time(x));
    store.push_back(split_plan(x));
  }
  plans.clear();
  for (const auto& p : store) plans.push_back(&p);
  const detail::BusiestVote vote = detail::busiest_vote(xs, ys, plans, 2, Interpolation::floor_power);
  EXPECT_GE(vote.points, 2);
  EXPECT_LT(vote.rows_error, 1e-9);
  EXPECT_GT(vote.axis_error, 0.05);
  EXPECT_TRUE(vote.rows_win());
  // One thread, or no threads known: no vote.
  EXPECT_EQ(detail::busiest_vote(xs, ys, plans, 1, Interpolation::floor_power).points, 0);
}
