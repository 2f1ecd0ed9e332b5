// The performance database's interpolation along one axis (Notes [fixed cost plus power law] and
// [monotone cubic in log-log] in src/perfdb/internal.h): exact at stored points, exact on power
// laws, exact on a fixed cost plus a power law, monotone on monotone data, no overshoot at a step,
// closer than the two-point log-log line on a launch-floor curve, the fallback to the cubic, the
// `how` text, the other rules on request, and leave-one-out's comparison and end-point groups.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>

#include "opforge/perfdb.h"
#include "perfdb/internal.h"
#include "tests/perfdb_test_util.h"

namespace fs = std::filesystem;
using namespace opforge;
using namespace opforge::perfdb;

namespace {

// The quick grid's token axis: neighbours 4x apart at small sizes, 2x above 128.
const std::vector<int64_t> kQuick = {1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096};

struct Folder : test_util::ScratchFolder {
  Folder() : ScratchFolder("perfdb_interp_test") {}
};

// An rms_norm table on `tokens` at hidden 4096, t = f(tokens), bytes 4 * tokens * hidden.
OpTable curve_table(const std::function<double(double)>& f, const std::vector<int64_t>& tokens = kQuick) {
  return test_util::rms_norm_line("sysI", tokens, f);
}

Database load(const Folder& dir, const OpTable& t) {
  write_table(t, dir.file("sysI/rms_norm.csv"));
  return Database::load("sysI", dir.str());
}

double at(const Database& db, int64_t tokens) {
  return db.query("rms_norm", "cpu", "bf16", {{"tokens", tokens}, {"hidden", 4096}}).us;
}

}  // namespace

TEST(PerfdbInterp, ExactAtStoredPoints) {
  // a curve that is no power law: a floor, a bend, a slope
  auto f = [](double x) { return 2.0 + x / 100 + 3 * std::sqrt(x); };
  Folder dir;
  Database db = load(dir, curve_table(f));
  for (int64_t tok : kQuick) {
    Answer a = db.query("rms_norm", "cpu", "bf16", {{"tokens", tok}, {"hidden", 4096}});
    EXPECT_EQ(a.method, Method::measured);
    EXPECT_EQ(a.us, f(double(tok))) << tok;
  }
  // the curve itself passes through every interior stored point, and is continuous there
  std::vector<double> xs, ys;
  for (int64_t tok : kQuick) {
    xs.push_back(double(tok));
    ys.push_back(f(double(tok)));
  }
  for (size_t i = 1; i + 1 < xs.size(); ++i) {
    EXPECT_NEAR(detail::interp_line(xs, ys, xs[i], Interpolation::monotone_cubic) / ys[i], 1.0, 1e-12) << xs[i];
    EXPECT_NEAR(detail::interp_line(xs, ys, xs[i] * (1 + 1e-9), Interpolation::monotone_cubic) / ys[i], 1.0, 1e-6);
    EXPECT_NEAR(detail::interp_line(xs, ys, xs[i] * (1 - 1e-9), Interpolation::monotone_cubic) / ys[i], 1.0, 1e-6);
  }
}

TEST(PerfdbInterp, ReproducesPowerLawsExactly) {
  for (double p : {0.3, 1.0, 1.7, 2.0}) {
    auto f = [p](double x) { return 0.7 * std::pow(x, p); };
    Folder dir;
    Database db = load(dir, curve_table(f));
    for (int64_t tok : {2, 3, 10, 40, 100, 200, 300, 700, 1500, 3000}) {
      Answer a = db.query("rms_norm", "cpu", "bf16", {{"tokens", tok}, {"hidden", 4096}});
      EXPECT_EQ(a.method, Method::interpolated);
      EXPECT_NEAR(a.us / f(double(tok)), 1.0, 1e-12) << "p=" << p << " tokens=" << tok;
    }
  }
}

TEST(PerfdbInterp, MonotoneOnMonotoneData) {
  // a floor, then a step (a cache level left behind), then a slope: non-decreasing data
  auto f = [](double x) { return x < 100 ? 2.0 : x < 300 ? 2.0 + (x - 100) / 10 : 40.0 + x / 50; };
  Folder dir;
  Database db = load(dir, curve_table(f));
  double prev = 0;
  for (int64_t tok = 1; tok <= 4096; tok += tok < 64 ? 1 : 7) {
    double t = at(db, tok);
    EXPECT_GE(t, prev * (1 - 1e-12)) << tok;
    prev = t;
  }
  // no overshoot: between two stored points the answer stays between their times
  for (size_t i = 0; i + 1 < kQuick.size(); ++i)
    for (int64_t tok = kQuick[i] + 1; tok < kQuick[i + 1]; tok += std::max<int64_t>(1, (kQuick[i + 1] - kQuick[i]) / 9)) {
      double t = at(db, tok);
      EXPECT_GE(t, f(double(kQuick[i])) * (1 - 1e-12)) << tok;
      EXPECT_LE(t, f(double(kQuick[i + 1])) * (1 + 1e-12)) << tok;
    }
  // flat data stays flat; decreasing data stays decreasing
  Folder flat_dir;
  Database flat = load(flat_dir, curve_table([](double) { return 5.0; }));
  EXPECT_NEAR(at(flat, 7), 5.0, 1e-12);
  EXPECT_NEAR(at(flat, 700), 5.0, 1e-12);
  Folder down_dir;
  Database down = load(down_dir, curve_table([](double x) { return 100.0 / (1 + std::log(x)); }));
  prev = 1e300;
  for (int64_t tok = 1; tok <= 4096; tok += 5) {
    double t = at(down, tok);
    EXPECT_LE(t, prev * (1 + 1e-12)) << tok;
    prev = t;
  }
}

TEST(PerfdbInterp, FollowsALaunchFloorBetterThanTheChord) {
  // t = fixed cost + size / throughput: convex in log-log, where the two-point chord overestimates
  auto f = [](double x) { return 2.0 + x / 100; };
  Folder dir;
  Database cubic = load(dir, curve_table(f));
  Database linear = Database::load("sysI", dir.str());
  linear.set_interpolation(Interpolation::log_linear);
  for (int64_t tok : {2, 8, 32, 100, 200, 700, 3000}) {
    double want = f(double(tok));
    double c = std::abs(at(cubic, tok) / want - 1), l = std::abs(at(linear, tok) / want - 1);
    EXPECT_LT(c, l) << tok;
    EXPECT_LT(c, 0.005) << tok;
  }
}

TEST(PerfdbInterp, HowSaysWhatWasDone) {
  Folder dir;
  Database db = load(dir, curve_table([](double x) { return 1 + x; }));
  Dims q = {{"tokens", 100}, {"hidden", 4096}};
  EXPECT_EQ(db.query("rms_norm", "cpu", "bf16", q).how,
            "interpolated in tokens between 64 and 128 (fixed cost plus power law)");
  db.set_interpolation(Interpolation::monotone_cubic);
  EXPECT_EQ(db.query("rms_norm", "cpu", "bf16", q).how,
            "interpolated in tokens between 64 and 128 (monotone cubic in log-log)");
  // data that no fixed cost plus power law passes through (falling): the cubic answers and says so
  Folder down_dir;
  Database down = load(down_dir, curve_table([](double x) { return 100.0 / (1 + std::log(x)); }));
  EXPECT_EQ(down.query("rms_norm", "cpu", "bf16", q).how,
            "interpolated in tokens between 64 and 128 (monotone cubic in log-log)");
  db.set_interpolation(Interpolation::log_linear);
  EXPECT_EQ(db.interpolation(), Interpolation::log_linear);
  Answer a = db.query("rms_norm", "cpu", "bf16", q);
  EXPECT_EQ(a.how, "interpolated in tokens between 64 and 128 (linear in log-log)");
  // the plain rule: log t linear in log tokens between the two neighbours
  double w = std::log(100.0 / 64) / std::log(2.0);
  EXPECT_NEAR(a.us, std::exp((1 - w) * std::log(65.0) + w * std::log(129.0)), 1e-9);
  // a line of two stored points is the straight line whatever is asked
  Folder two_dir;
  Database two = load(two_dir, curve_table([](double x) { return 1 + x; }, {64, 128}));
  EXPECT_EQ(two.query("rms_norm", "cpu", "bf16", q).how, "interpolated in tokens between 64 and 128 (linear in log-log)");
  EXPECT_NEAR(two.query("rms_norm", "cpu", "bf16", q).us, a.us, 1e-9);
  EXPECT_STREQ(interpolation_name(Interpolation::monotone_cubic), "monotone cubic in log-log");
  EXPECT_STREQ(interpolation_name(Interpolation::floor_power), "fixed cost plus power law");
}

TEST(PerfdbInterp, FixedCostPlusPowerLawIsExact) {
  // a launch floor plus a size term of any power, at 4x and 2x spacing: every interior query exact,
  // where the log-log rules are not (the cubic within a few percent, the chord worse)
  for (double p : {0.5, 1.0, 1.6, 2.0}) {
    auto f = [p](double x) { return 3.0 + 0.01 * std::pow(x, p); };
    Folder dir;
    Database db = load(dir, curve_table(f));
    Database cubic = Database::load("sysI", dir.str());
    cubic.set_interpolation(Interpolation::monotone_cubic);
    double worst_cubic = 0;
    for (int64_t tok : {2, 3, 10, 40, 100, 200, 300, 700, 1500, 3000}) {
      Answer a = db.query("rms_norm", "cpu", "bf16", {{"tokens", tok}, {"hidden", 4096}});
      EXPECT_EQ(a.how.substr(a.how.size() - 27), "(fixed cost plus power law)") << a.how;
      EXPECT_NEAR(a.us / f(double(tok)), 1.0, 1e-9) << "p=" << p << " tokens=" << tok;
      worst_cubic = std::max(worst_cubic, std::abs(at(cubic, tok) / f(double(tok)) - 1));
    }
    EXPECT_GT(worst_cubic, 1e-4) << p;  // the family is not the cubic's
  }
  // the fit itself: the three parameters back, none where no fixed cost >= 0 explains the points
  auto fit = detail::fit_floor_power(4, 3.0 + 0.01 * 8, 16, 3.0 + 0.01 * 64, 64, 3.0 + 0.01 * 512);
  ASSERT_TRUE(fit.has_value());
  EXPECT_NEAR(fit->a, 3.0, 1e-9);
  EXPECT_NEAR(fit->p, 1.5, 1e-9);
  EXPECT_NEAR(fit->at(32), 3.0 + 0.01 * std::pow(32.0, 1.5), 1e-9);
  EXPECT_FALSE(detail::fit_floor_power(1, 5, 2, 5, 4, 6).has_value());       // flat, then rising
  EXPECT_FALSE(detail::fit_floor_power(1, 6, 2, 5, 4, 4).has_value());       // falling
  EXPECT_FALSE(detail::fit_floor_power(1, 1, 2, 9, 4, 10).has_value());      // a step: a < 0 needed
  EXPECT_FALSE(detail::fit_floor_power(1, 1, 2, 1.001, 4, 1e9).has_value());  // beyond any power <= 8
}

TEST(PerfdbInterp, FixedCostPlusPowerLawStaysBetweenTheNeighbours) {
  // rising data with kinks, noise and steps: every answer between its two neighbours' times
  const std::vector<double> ys = {2.0, 2.1, 2.05, 3.0, 9.0, 9.5, 30.0, 31.0, 80.0, 200.0};
  std::vector<double> xs;
  for (int64_t tok : kQuick) xs.push_back(double(tok));
  for (size_t i = 0; i + 1 < xs.size(); ++i)
    for (int k = 1; k < 16; ++k) {
      const double x = xs[i] * std::pow(xs[i + 1] / xs[i], k / 16.0);
      const double y = detail::interp_line(xs, ys, x, Interpolation::floor_power);
      EXPECT_GE(y, std::min(ys[i], ys[i + 1]) * (1 - 1e-12)) << x;
      EXPECT_LE(y, std::max(ys[i], ys[i + 1]) * (1 + 1e-12)) << x;
    }
  // a line of two points is the straight line in log-log, whatever is asked
  Interpolation used = Interpolation::floor_power;
  EXPECT_NEAR(detail::interp_line({1, 4}, {2, 8}, 2, Interpolation::floor_power, &used), 4.0, 1e-12);
  EXPECT_EQ(used, Interpolation::log_linear);
}

TEST(PerfdbInterp, LeaveOneOutComparesAndReportsEndsApart) {
  // t = 0.5 * tokens^0.8, bytes proportional to tokens: interior points exact by both rules; the
  // ends, extrapolated holding the roofline fraction, are off by the neighbour ratio^0.2
  Folder dir;
  Database db = load(dir, curve_table([](double x) { return 0.5 * std::pow(x, 0.8); }));
  std::vector<ValidationRow> v = leave_one_out(db);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].points, int(kQuick.size()) - 2);
  EXPECT_EQ(v[0].log_linear.points, v[0].points);
  EXPECT_LT(v[0].max_rel_err, 1e-12);
  EXPECT_LT(v[0].log_linear.max_rel_err, 1e-12);
  ASSERT_EQ(v[0].below.points, 1);  // tokens 1, from 4 (4x below)
  EXPECT_NEAR(v[0].below.max_rel_err, 1 - std::pow(4.0, -0.2), 1e-12);
  EXPECT_EQ(v[0].below.worst, "cpu bf16 tokens=1, hidden=4096 along tokens");
  ASSERT_EQ(v[0].beyond.points, 1);  // tokens 4096, from 2048
  EXPECT_NEAR(v[0].beyond.median_rel_err, std::pow(2.0, 0.2) - 1, 1e-12);
  // on a launch-floor curve the cubic's interior error is the smaller one
  Folder floor_dir;
  Database floor = load(floor_dir, curve_table([](double x) { return 2.0 + x / 100; }));
  ValidationRow f = leave_one_out(floor)[0];
  EXPECT_LT(f.median_rel_err, f.log_linear.median_rel_err);
  EXPECT_LT(f.max_rel_err, f.log_linear.max_rel_err);
  // the per-point listing (`perfdb validate --points`) holds every interior prediction behind the
  // numbers: as many as counted, measured times the stored ones, the worst one among them
  ASSERT_EQ(int(f.interior.size()), f.points);
  double worst = 0;
  for (const ValidationPoint& p : f.interior) {
    const double tokens = std::stod(p.where.substr(p.where.find("tokens=") + 7));
    EXPECT_DOUBLE_EQ(p.measured_us, 2.0 + tokens / 100) << p.where;
    worst = std::max(worst, std::abs(p.predicted_us - p.measured_us) / p.measured_us);
  }
  EXPECT_DOUBLE_EQ(worst, f.max_rel_err);
}
