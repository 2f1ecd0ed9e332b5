// Kernels' plans in the performance database (Note [plan regimes] in opforge/plan.h, Note [plan
// lines] in src/perfdb/internal.h): the text form and its errors, the recording of notes, the
// plan column of a table (written, read, an old file upgraded, a malformed field), a CPU kernel
// noting its thread decision, and interpolation kept within one plan: exact on power-law runs
// on both sides of a switch where the line through both is not, the switch placed from the
// neighbours' values, and the whole line where a switch cannot be placed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "opforge/perfdb.h"
#include "opforge/plan.h"
#include "opforge/registry.h"
#include "opforge/tensor.h"
#include "backends/cpu/cpu_info.h"
#include "perfdb/internal.h"
#include "tests/perfdb_test_util.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace opforge;
using namespace opforge::perfdb;

namespace {

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no opforge::Error thrown";
  return ErrorCode::internal;
}

// A line with a switch at x = 20 (value 1000 x against threshold 20000): time 2 x below it (one
// thread), 0.8 x from it on (two). Both runs are power laws.
constexpr double kSwitch = 20;
double step_time(double x) { return x < kSwitch ? 2.0 * x : 0.8 * x; }
std::vector<plan::Decision> step_plan(double x) {
  return {{"threads", x >= kSwitch, 1000 * x, 1000 * kSwitch}, {"stream", false, 10 * x, 1e9}};
}

OpTable step_table(const std::vector<int64_t>& tokens, bool with_plans, const std::string& system = "sysP") {
  return test_util::rms_norm_line(system, tokens, step_time, with_plans ? step_plan : nullptr);
}

const std::vector<int64_t> kLine = {1, 2, 4, 8, 16, 32, 48, 64, 128};

}  // namespace

TEST(PerfdbPlan, TextRoundTripsAndRejectsMalformedText) {
  const std::vector<plan::Decision> d = {{"threads", true, 98304, 65536}, {"stream", false, 1.5e-3, 6.7e7},
                                         {"threads.2", false, 12, 13}};
  EXPECT_EQ(plan::to_text(d), "threads+98304/65536;stream-0.0015/67000000;threads.2-12/13");
  EXPECT_EQ(plan::parse(plan::to_text(d)), d);
  EXPECT_TRUE(plan::parse("").empty());
  EXPECT_EQ(plan::parse("stream+1.2e+08/6.7e+07")[0].value, 1.2e8);
  for (const char* bad : {"threads", "threads+", "threads+1", "threads*1/2", "+1/2", "threads+x/2", "threads+1/",
                          "threads+1/2;threads-1/2", "Threads+1/2", "threads+1/2;", "threads+inf/2"})
    EXPECT_EQ(code_of([&] { plan::parse(bad); }), ErrorCode::parse) << bad;
}

TEST(PerfdbPlan, RecordingKeepsDistinctNotesOfThisThreadOnly) {
  plan::note("threads", true, 1, 1);  // no recording: dropped
  {
    plan::Recording rec;
    EXPECT_EQ(code_of([] { plan::Recording nested; }), ErrorCode::internal);
    plan::note("threads", false, 10, 20);
    plan::note("threads", false, 10, 20);  // the same decision again (a second call): once
    plan::note("stream", true, 5, 4);
    plan::note("threads", true, 30, 20);  // a second, different decision under the same key
    std::thread other([] { plan::note("gemm", true, 1, 1); });  // another thread: not ours
    other.join();
    const std::vector<plan::Decision> want = {
        {"threads", false, 10, 20}, {"stream", true, 5, 4}, {"threads.2", true, 30, 20}};
    EXPECT_EQ(rec.decisions(), want);
  }
  plan::Recording again;  // the first one ended: a new one starts empty
  EXPECT_TRUE(again.decisions().empty());
}

TEST(PerfdbPlan, TableWritesReadsAndUpgradesThePlanColumn) {
  test_util::ScratchFolder folder("perfdb_plan_test");
  const std::string dir = folder.str();
  const std::string path = dir + "/rms_norm.csv";
  OpTable t = step_table({1, 32}, true);
  write_table(t, path);
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(",energy_uj,plan\n"), std::string::npos);
  EXPECT_NE(text.find(",threads+32000/20000;stream-320/1000000000\n"), std::string::npos);
  OpTable back = read_table(path);
  EXPECT_TRUE(back.has_plan);
  ASSERT_EQ(back.rows.size(), 2u);
  EXPECT_EQ(back.rows[0].plan, step_plan(1));
  EXPECT_EQ(back.rows[1].plan, step_plan(32));

  // A file without the column reads with empty plans; appending planned rows rewrites it with it.
  const std::string old_path = dir + "/old.csv";
  OpTable old = step_table({1, 2}, false);
  write_table(old, old_path);
  EXPECT_FALSE(read_table(old_path).has_plan);
  append_rows(old_path, old.dim_names, step_table({4}, true).rows);
  OpTable upgraded = read_table(old_path);
  EXPECT_TRUE(upgraded.has_plan);
  ASSERT_EQ(upgraded.rows.size(), 3u);
  EXPECT_TRUE(upgraded.rows[0].plan.empty());
  EXPECT_EQ(upgraded.rows[2].plan, step_plan(4));
  append_rows(old_path, old.dim_names, step_table({8}, false).rows);  // an unplanned row: empty field
  EXPECT_TRUE(read_table(old_path).rows.back().plan.empty());

  // A malformed plan field: an error naming the file and line.
  std::string broken = text;
  broken.replace(broken.find("threads+32000/20000"), 19, "threads+32000|20000");
  std::ofstream(dir + "/broken.csv") << broken;
  try {
    read_table(dir + "/broken.csv");
    ADD_FAILURE() << "read a malformed plan";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::parse);
    EXPECT_NE(std::string(e.what()).find("broken.csv:"), std::string::npos) << e.what();
  }
}

TEST(PerfdbPlan, CpuKernelNotesItsThreadDecision) {
  // rms_norm's cpu kernel (Note [balanced tasks]): one row stays on the calling thread; 64 rows of
  // 4096 f32 (2 MiB moved) go to both threads, and the note says so, with the bytes it compared.
  const Registry& reg = global_registry();
  auto plan_of = [&](int64_t rows) {
    test_util::Buf x = test_util::make({rows, 4096}, DType::f32), y = test_util::make({rows, 4096}, DType::f32);
    test_util::Buf w = test_util::make({4096}, DType::f32);
    for (const test_util::Buf* b : {&x, &w}) std::memset(b->view.data, 0, size_t(b->storage.nbytes()));
    plan::Recording rec;
    const std::vector<Value> call = {y.view, x.view, w.view, 1e-6, 0.0};
    EXPECT_EQ(reg.call("rms_norm", call).impl(), "cpu");
    return rec.decisions();
  };
  const int saved = cpu::set_thread_count_for_testing(2);
  auto find = [](const std::vector<plan::Decision>& d, const std::string& key) -> const plan::Decision* {
    for (const plan::Decision& x : d)
      if (x.key == key) return &x;
    return nullptr;
  };
  const std::vector<plan::Decision> one = plan_of(1), many = plan_of(64);
  cpu::set_thread_count_for_testing(saved);
  const plan::Decision *t1 = find(one, "threads"), *t64 = find(many, "threads");
  ASSERT_NE(t1, nullptr) << plan::to_text(one);
  ASSERT_NE(t64, nullptr) << plan::to_text(many);
  EXPECT_FALSE(t1->on);
  EXPECT_TRUE(t64->on);
  EXPECT_EQ(t64->value, 64.0 * t1->value);  // bytes, in proportion to the rows
  EXPECT_EQ(t64->threshold, t1->threshold);
  ASSERT_NE(find(many, "stream"), nullptr);
  EXPECT_FALSE(find(many, "stream")->on);
}

TEST(PerfdbPlan, InterpolatesWithinOnePlan) {
  std::vector<double> xs, ys;
  std::vector<std::vector<plan::Decision>> store;
  for (int64_t x : kLine) {
    xs.push_back(double(x));
    ys.push_back(step_time(double(x)));
    store.push_back(step_plan(double(x)));
  }
  std::vector<perfdb::detail::PlanRef> plans;
  for (const auto& p : store) plans.push_back(&p);
  for (double x : {3.0, 5.0, 12.0, 18.0, 19.9, 20.5, 24.0, 40.0, 100.0}) {
    perfdb::detail::LineNote note;
    const double planned = perfdb::detail::interp_line_planned(xs, ys, plans, x, Interpolation::floor_power, &note);
    const std::string& how = note.plan;
    EXPECT_NEAR(planned / step_time(x), 1.0, 1e-9) << x << ": " << how;
    EXPECT_FALSE(how.empty()) << x;
    if (x > 16 && x < 32) {
      EXPECT_NE(how.find("past the plan switch between 16 and 32"), std::string::npos) << how;
    }
  }
  // The whole line bends through the switch: off by a lot beside it.
  EXPECT_GT(std::abs(perfdb::detail::interp_line(xs, ys, 24, Interpolation::floor_power) / step_time(24) - 1), 0.2);

  // A switch that cannot be placed (the threads decision missing at 32): the whole line answers.
  std::vector<plan::Decision> missing = {{"stream", false, 320, 1e9}};
  plans[5] = &missing;
  perfdb::detail::LineNote note;
  EXPECT_EQ(perfdb::detail::interp_line_planned(xs, ys, plans, 24, Interpolation::floor_power, &note),
            perfdb::detail::interp_line(xs, ys, 24, Interpolation::floor_power));
  EXPECT_EQ(note.plan, "across a plan switch it cannot place");
  // No plans at all: the whole line, and nothing said about plans.
  const std::vector<perfdb::detail::PlanRef> none(xs.size(), nullptr);
  EXPECT_EQ(perfdb::detail::interp_line_planned(xs, ys, none, 24, Interpolation::floor_power, &note),
            perfdb::detail::interp_line(xs, ys, 24, Interpolation::floor_power));
  EXPECT_TRUE(note.plan.empty());
}

TEST(PerfdbPlan, QueriesAndLeaveOneOutUseThePlans) {
  test_util::ScratchFolder folder("perfdb_plan_test");
  const std::string dir = folder.str();
  write_table(step_table(kLine, true), dir + "/sysP/rms_norm.csv");
  Database db = Database::load("sysP", dir);
  Answer a = db.query("rms_norm", "cpu", "bf16", {{"tokens", 24}, {"hidden", 4096}});
  EXPECT_EQ(a.method, Method::interpolated);
  EXPECT_NEAR(a.us / step_time(24), 1.0, 1e-9);
  EXPECT_NE(a.how.find("plan switch"), std::string::npos) << a.how;

  // Leave-one-out on the planned line is exact; without the plans it is not.
  ValidationRow planned = leave_one_out(db).at(0);
  EXPECT_LT(planned.max_rel_err, 1e-9) << planned.worst;
  write_table(step_table(kLine, false, "sysQ"), dir + "/sysQ/rms_norm.csv");
  ValidationRow plain = leave_one_out(Database::load("sysQ", dir)).at(0);
  EXPECT_GT(plain.max_rel_err, 0.2);
}
