// Pieces shared by the perfdb sources (not installed).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "opforge/perfdb.h"

namespace opforge::perfdb::detail {

// log(y) linear in log(x) through (x0, y0) and (x1, y1), evaluated at x; x0 != x1, all > 0.
inline double log_interp(double x0, double y0, double x1, double y1, double x) {
  double w = (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0));
  return std::exp(std::log(y0) + w * (std::log(y1) - std::log(y0)));
}

// The weight of the upper neighbour x1 at x in log(x): 0 at x0, 1 at x1.
inline double log_weight(double x0, double x1, double x) {
  return (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0));
}

// Note [monotone cubic in log-log]: along one axis the stored points of a line are interpolated
// with a monotone piecewise-cubic Hermite curve (PCHIP, Fritsch-Carlson) through (log x, log y):
//   - interior slope at a point: 0 where the neighbouring secants differ in sign or one is 0,
//     else their weighted harmonic mean (Fritsch-Butland weights 2h1+h0, h1+2h0 for spacings
//     h0 before and h1 after the point);
//   - end slope: the one-sided three-point estimate, set to 0 when its sign differs from the end
//     secant's, and limited to 3x the end secant when the secants change sign;
//   - two points only: the straight line (the log-log linear rule of the issue).
// It passes through every stored point, reproduces a power law y = c x^p exactly (every secant
// is p, so every slope is p), keeps data that is monotone along the line monotone (no overshoot),
// and, through the neighbours' slopes, follows the curvature of times that bend from a launch
// floor into a bandwidth slope, where the two-point chord in log-log overestimates. The curve on
// [x_i, x_i+1] depends only on the points i-1 .. i+2.

// The slopes of that curve at xs (strictly increasing), ys any values; xs.size() >= 2.
inline std::vector<double> pchip_slopes(const std::vector<double>& xs, const std::vector<double>& ys) {
  const size_t n = xs.size();
  std::vector<double> h(n - 1), d(n - 1), m(n, 0.0);
  for (size_t i = 0; i + 1 < n; ++i) {
    h[i] = xs[i + 1] - xs[i];
    d[i] = (ys[i + 1] - ys[i]) / h[i];
  }
  if (n == 2) return {d[0], d[0]};
  for (size_t i = 1; i + 1 < n; ++i) {
    if (d[i - 1] * d[i] <= 0) continue;  // a local extremum or a flat secant: slope 0
    double w1 = 2 * h[i] + h[i - 1], w2 = h[i] + 2 * h[i - 1];
    m[i] = (w1 + w2) / (w1 / d[i - 1] + w2 / d[i]);
  }
  auto end = [](double h0, double h1, double d0, double d1) {
    double s = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1);
    if (s * d0 <= 0) return 0.0;
    if (d0 * d1 <= 0 && std::abs(s) > std::abs(3 * d0)) return 3 * d0;
    return s;
  };
  m[0] = end(h[0], h[1], d[0], d[1]);
  m[n - 1] = end(h[n - 2], h[n - 3], d[n - 2], d[n - 3]);
  return m;
}

// The curve through (xs, ys) with slopes m at x, xs.front() <= x <= xs.back().
inline double hermite_at(const std::vector<double>& xs, const std::vector<double>& ys, const std::vector<double>& m,
                         double x) {
  size_t i = 0;
  while (i + 2 < xs.size() && x > xs[i + 1]) ++i;
  double h = xs[i + 1] - xs[i], t = (x - xs[i]) / h, t2 = t * t, t3 = t2 * t;
  return (2 * t3 - 3 * t2 + 1) * ys[i] + (t3 - 2 * t2 + t) * h * m[i] + (-2 * t3 + 3 * t2) * ys[i + 1] +
         (t3 - t2) * h * m[i + 1];
}

// Note [fixed cost plus power law]: a kernel's time along an axis is, to first order, a fixed
// cost (launch, synchronisation, a minimum of work per thread) plus a part that grows as a power
// of the size (bytes over a bandwidth: power 1; attention's tokens^2: power 2; a kernel filling
// the machine: a power that is not constant). So between two stored neighbours x_i < x < x_i+1
// the default rule fits
//     y = a + b * x^p,   a >= 0, b > 0, 0 < p <= 8,
// through three consecutive stored points that hold both neighbours, (i-1, i, i+1) and
// (i, i+1, i+2), where those exist and y rises strictly along them, and answers with the
// geometric mean of the fits that exist (one or two). The curve family holds both the plain
// power law (a = 0; the log-log rules are exact there too) and the affine time of a fixed cost
// plus a constant throughput (p = 1; the log-log rules are not), and every such curve rises from
// one neighbour to the other, so the answer stays between their times: exact at stored points,
// monotone data stays monotone, no overshoot. Where no such curve passes through the points
// (flat or falling data, a concave step a fixed cost cannot explain), the monotone cubic in
// log-log below answers. Leave-one-out on the shipped H200 and CPU data (docs/perf/estimator.md,
// 2026-11-26): median over all interior points 2.20% -> 1.84% (H200) and 2.82% -> 2.68% (CPU),
// p90 10.18% -> 9.86% and 23.01% -> 22.95%, against the cubic alone; a straight line in the
// roofline time where the log-log secant lies in [0, 1] did better on the medians but is not
// exact on power laws, so it was not kept.
struct FloorPower {
  double a = 0, b = 0, p = 0;  // y = a + b * (x / x1)^p, x1 the middle point of the fit
  double x1 = 1;
  double at(double x) const { return a + b * std::pow(x / x1, p); }
};

// The curve of the Note through (x0, y0), (x1, y1), (x2, y2), x and y strictly increasing.
inline std::optional<FloorPower> fit_floor_power(double x0, double y0, double x1, double y1, double x2, double y2) {
  if (!(x0 > 0 && x0 < x1 && x1 < x2 && y0 < y1 && y1 < y2)) return std::nullopt;
  const double u0 = x0 / x1, u2 = x2 / x1;  // in units of x1: u0 < 1 < u2
  const double want = (y1 - y0) / (y2 - y1);
  // (1 - u0^p) / (u2^p - 1) falls strictly from log(1/u0) / log(u2) (p -> 0) towards 0.
  auto ratio = [&](double p) { return -std::expm1(p * std::log(u0)) / std::expm1(p * std::log(u2)); };
  double lo = 1e-3, hi = 8.0;
  if (!(ratio(hi) <= want && want <= ratio(lo))) return std::nullopt;
  for (int i = 0; i < 200 && hi - lo > 1e-15 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (ratio(mid) > want ? lo : hi) = mid;
  }
  FloorPower f;
  f.p = 0.5 * (lo + hi);
  f.x1 = x1;
  f.b = (y2 - y1) / std::expm1(f.p * std::log(u2));
  f.a = y1 - f.b;
  if (!(f.a >= 0 && f.b > 0)) return std::nullopt;
  return f;
}

// y at x (xs.front() < x < xs.back(), not a stored value) by the Note: the geometric mean of the
// fits through the triples of consecutive points holding x's two neighbours; nullopt when none fits.
inline std::optional<double> floor_power_at(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  size_t i = 0;
  while (i + 2 < xs.size() && x > xs[i + 1]) ++i;
  double log_sum = 0;
  int fits = 0;
  for (const long long first : {(long long)i - 1, (long long)i}) {
    if (first < 0 || size_t(first) + 2 >= xs.size()) continue;
    auto f = fit_floor_power(xs[first], ys[first], xs[first + 1], ys[first + 1], xs[first + 2], ys[first + 2]);
    if (!f) continue;
    log_sum += std::log(std::clamp(f->at(x), ys[i], ys[i + 1]));
    ++fits;
  }
  if (fits == 0) return std::nullopt;
  return std::exp(log_sum / fits);
}

// y at x along a line of stored points (xs strictly increasing, all xs and ys > 0, xs.front() <
// x < xs.back()) by `method`: fixed cost plus power law (Note above, the monotone cubic where
// no such curve fits), the monotone cubic in log-log, or log y linear in log x between the two
// neighbours of x. `used`, when given, receives the rule that answered (a line of two points is
// the straight line whatever is asked).
inline double interp_line(const std::vector<double>& xs, const std::vector<double>& ys, double x, Interpolation method,
                          Interpolation* used = nullptr) {
  if (method == Interpolation::floor_power && xs.size() > 2) {
    if (std::optional<double> y = floor_power_at(xs, ys, x)) {
      if (used) *used = Interpolation::floor_power;
      return *y;
    }
    method = Interpolation::monotone_cubic;
  }
  if (method != Interpolation::log_linear && xs.size() > 2) {
    if (used) *used = Interpolation::monotone_cubic;
    std::vector<double> lx(xs.size()), ly(ys.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      lx[i] = std::log(xs[i]);
      ly[i] = std::log(ys[i]);
    }
    return std::exp(hermite_at(lx, ly, pchip_slopes(lx, ly), std::log(x)));
  }
  if (used) *used = Interpolation::log_linear;
  size_t i = 0;
  while (i + 2 < xs.size() && x > xs[i + 1]) ++i;
  return log_interp(xs[i], ys[i], xs[i + 1], ys[i + 1], x);
}

// Note [plan lines]: where the rows of a line carry the kernel's plan (Note [plan regimes] in
// opforge/plan.h), a query is answered from the rows of its own plan only:
//   - the plan of a row is its set of (key, on) decisions; rows of equal sets form runs along
//     the line;
//   - both neighbours of the query in one run: the query is in that run too (a switch is
//     monotone in the size), and the one-axis rule above runs on that run's rows alone, so no
//     fit bends through a switch;
//   - neighbours in different runs: the switch lies between them. For every decision that
//     differs, its value (bytes, rows: proportional to the axis in practice) is interpolated
//     linearly in log-log between the two neighbours' values and compared with the threshold,
//     which places the query on one side. The answer then continues that side's run past its
//     last row by the log-log secant of its last two rows (time proportional to the axis from a
//     run of one row). Exact where the run follows a power law up to the switch.
//   - no plans, or a switch that cannot be placed (a decision missing on one side, thresholds
//     that differ, values that do not match their outcome): the rule above on the whole line.
// On the 2-core Xeon VM the switches are one thread to two (a few tens of KiB a call), the
// streaming stores past the L3 share, and linear's dot-product path for a few rows.
using PlanRef = const std::vector<plan::Decision>*;

inline std::vector<std::pair<std::string, bool>> plan_signature(PlanRef p) {
  std::vector<std::pair<std::string, bool>> sig;
  if (p)
    for (const plan::Decision& d : *p) sig.emplace_back(d.key, d.on);
  std::sort(sig.begin(), sig.end());
  return sig;
}

// The query's side of the switch between rows lo and hi (x_lo < x < x_hi): -1 lo's run, +1
// hi's, 0 when it cannot be placed.
inline int plan_side(PlanRef lo, PlanRef hi, double x_lo, double x_hi, double x) {
  if (!lo || !hi) return 0;
  auto find = [](PlanRef p, const std::string& key) -> const plan::Decision* {
    for (const plan::Decision& d : *p)
      if (d.key == key) return &d;
    return nullptr;
  };
  auto consistent = [](const plan::Decision& d) { return d.value > 0 && d.threshold > 0 && d.on == (d.value >= d.threshold); };
  std::set<std::string> keys;
  for (PlanRef p : {lo, hi})
    for (const plan::Decision& d : *p) keys.insert(d.key);
  std::vector<std::pair<std::string, bool>> query;
  for (const std::string& k : keys) {
    const plan::Decision *a = find(lo, k), *b = find(hi, k);
    if (!a || !b) return 0;
    if (a->on == b->on) {
      query.emplace_back(k, a->on);
      continue;
    }
    if (!consistent(*a) || !consistent(*b) || a->value == b->value ||
        std::abs(a->threshold - b->threshold) > 1e-9 * a->threshold)
      return 0;
    query.emplace_back(k, log_interp(x_lo, a->value, x_hi, b->value, x) >= a->threshold);
  }
  std::sort(query.begin(), query.end());
  if (query == plan_signature(lo)) return -1;
  if (query == plan_signature(hi)) return 1;
  return 0;
}

// Note [busiest thread's rows]: a CPU kernel that cuts its rows over T threads (Note [balanced
// tasks] in backends/cpu/tiling.h; its plan says so by a `threads` decision that is on) takes as
// long as its busiest thread, which gets ceil(rows / T) of them. At a few rows that count is a
// staircase in the axis: on the 2-thread Xeon VM fused_add_rms_norm at hidden 8,192 takes 3.53 us
// at 2 tokens (a row a thread), 6.37 at 3 and 6.50 at 4 (two), 9.43 at 6 (three). No curve in the
// axis follows the stair (they put 3 tokens well below 4); a curve in b = ceil(axis / T) does, and
// is exact on it: equal busiest rows, equal time. So, within a run of rows whose plan splits them
// over threads (Note [plan lines]), T the threads of the table's device (its `device` header
// ends "(T threads)", as `opforge collect` writes it; a GPU's does not, and keeps the rules above):
//   - the run's rows are placed at b, rows of equal b merged (the geometric mean of their times),
//     and the query at b = ceil(x / T);
//   - a query whose b is stored answers with that time; else the one-axis rule runs on the merged
//     points, or, past a plan switch, the run continues from its end in b (Note [plan lines]);
//   - where T divides every x involved this is the rule in x itself (every rule here is exact
//     under a scaling of the axis), so answers change only at sizes that do not split evenly.
// The plan does not say what the rows are: the axis (rms_norm: rows = tokens), a multiple of it
// (moe_permute: tokens x k pairs, an even count at 3 tokens), or tiles of elements rather than
// rows (the activations). So each table's own rows vote, per impl and axis (busiest_vote): every
// interior row of a split run whose busiest rows lie among those of the rest of its run (beyond
// them both axes only continue a slope, which says nothing about the stair) and whose prediction
// differs between the two axes is predicted from the rest of its line both ways. b answers where
// its summed |log error| is the smaller, and where no row can tell (the plan's word stands); else
// the axis itself, as before. `how` says where b answered. Leave-one-out on the shipped CPU data
// (docs/perf/estimator.md, 2026-11-27, 20:00 UTC; a left-out row is out of the vote too):
// fused_add_rms_norm p90 11.18% -> 8.10%, layer_norm 9.25% -> 7.39%, rms_norm 8.82% -> 7.93%,
// gemma_fused_add_rms_norm 7.86% -> 6.15%; the vote keeps the axis for moe_permute and the
// activations, where b alone would raise their p90 from 8-10% to 11-13%.
inline bool split_over_threads(PlanRef p) {
  bool any = false;
  if (p)
    for (const plan::Decision& d : *p)
      if (d.key == "threads" || d.key.rfind("threads.", 0) == 0) {
        if (!d.on) return false;  // part of the call on one thread: not one staircase
        any = true;
      }
  return any;
}

// The busiest of `threads` threads' rows at axis value x (x rows split evenly).
inline double busiest_rows(double x, int threads) { return std::ceil(x / double(threads)); }

// What interp_line_planned used, for a query's `how`.
struct LineNote {
  Interpolation used = Interpolation::floor_power;  // the one-axis rule that answered, unless `stored`
  bool stored = false;  // a stored time answered (equal busiest-thread rows, Note [busiest thread's rows])
  std::string plan;     // the plan's part ("" when the whole line answered)
};

// interp_line (same arguments) by Note [plan lines]; plans[i] is row i's plan (null: none).
// `threads` > 1: Note [busiest thread's rows] within runs split over threads, `axis` naming x in
// `note`. `note`, when given, receives what answered.
inline double interp_line_planned(const std::vector<double>& xs, const std::vector<double>& ys,
                                  const std::vector<PlanRef>& plans, double x, Interpolation method,
                                  LineNote* note = nullptr, int threads = 0, const std::string& axis = "x") {
  LineNote scratch;
  LineNote& out = note ? *note : scratch;
  out = LineNote{method, false, ""};
  size_t lo = 0;
  while (lo + 2 < xs.size() && x > xs[lo + 1]) ++lo;
  const size_t hi = lo + 1;
  const bool planned = plans.size() == xs.size() && plans[lo] && plans[hi] && !(plans[lo]->empty() && plans[hi]->empty());
  if (!planned) return interp_line(xs, ys, x, method, &out.used);
  std::vector<std::vector<std::pair<std::string, bool>>> sig(xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    if (plans[i]) sig[i] = plan_signature(plans[i]);
  auto run_of = [&](size_t at) {
    size_t a = at, b = at;
    while (a > 0 && plans[a - 1] && sig[a - 1] == sig[at]) --a;
    while (b + 1 < xs.size() && plans[b + 1] && sig[b + 1] == sig[at]) ++b;
    return std::pair<size_t, size_t>{a, b};
  };
  // The run [a, b] on the busiest thread's rows (Note [busiest thread's rows]): merged points,
  // and the axis values of the rows behind each ("3 and 4").
  std::vector<double> bx, by;
  std::vector<std::string> from;
  auto busiest_points = [&](size_t a, size_t b) {
    bx.clear();
    by.clear();
    from.clear();
    std::vector<int> count;
    for (size_t i = a; i <= b; ++i) {
      const double r = busiest_rows(xs[i], threads);
      if (bx.empty() || bx.back() != r) {
        bx.push_back(r);
        by.push_back(0);
        count.push_back(0);
        from.push_back(fmt::format("{}", xs[i]));
      } else {
        from.back() += fmt::format(" and {}", xs[i]);
      }
      by.back() += std::log(ys[i]);
      ++count.back();
    }
    for (size_t k = 0; k < by.size(); ++k) by[k] = std::exp(by[k] / count[k]);
  };
  auto rows_text = [&](double r) {
    return fmt::format("the busiest of {} threads' rows ceil({} / {}) = {}", threads, axis, threads, r);
  };
  const bool busiest = threads > 1;
  const double bq = busiest ? busiest_rows(x, threads) : 0;
  if (sig[lo] == sig[hi]) {
    const auto [a, b] = run_of(lo);
    const bool whole = a == 0 && b + 1 == xs.size();
    if (busiest && split_over_threads(plans[lo])) {
      busiest_points(a, b);
      const std::string part = whole ? "" : fmt::format("the {} rows of its plan, ", b - a + 1);
      if (auto at = std::find(bx.begin(), bx.end(), bq); at != bx.end()) {
        out.stored = true;
        const size_t k = size_t(at - bx.begin());
        out.plan = fmt::format("{}{} as stored at {} {}", part, rows_text(bq), axis, from[k]);
        return by[k];
      }
      out.plan = fmt::format("{}along {}", part, rows_text(bq));
      return interp_line(bx, by, bq, method, &out.used);
    }
    if (whole) return interp_line(xs, ys, x, method, &out.used);
    out.plan = fmt::format("the {} rows of its plan", b - a + 1);
    const std::vector<double> rx(xs.begin() + a, xs.begin() + b + 1), ry(ys.begin() + a, ys.begin() + b + 1);
    return interp_line(rx, ry, x, method, &out.used);
  }
  const int side = plan_side(plans[lo], plans[hi], xs[lo], xs[hi], x);
  if (side == 0) {
    out.plan = "across a plan switch it cannot place";
    return interp_line(xs, ys, x, method, &out.used);
  }
  const size_t end = side < 0 ? lo : hi;
  const auto [a, b] = run_of(end);
  const std::string past = fmt::format("past the plan switch between {} and {}: the {} row(s) of its plan", xs[lo],
                                       xs[hi], b - a + 1);
  out.used = Interpolation::log_linear;
  if (busiest && split_over_threads(plans[end])) {
    busiest_points(a, b);
    const size_t e = side < 0 ? bx.size() - 1 : 0;  // the merged point at the switch
    if (bx[e] == bq) {
      out.stored = true;
      out.plan = fmt::format("{}, {} as stored at {} {}", past, rows_text(bq), axis, from[e]);
      return by[e];
    }
    double slope = 1;  // log time over log rows
    if (bx.size() > 1) {
      const size_t o = side < 0 ? e - 1 : e + 1;
      slope = std::log(by[e] / by[o]) / std::log(bx[e] / bx[o]);
    }
    out.plan = fmt::format("{} continued from {}, along {}", past, xs[end], rows_text(bq));
    return by[e] * std::pow(bq / bx[e], slope);
  }
  double slope = 1;  // log time over log axis
  if (b > a) {
    const size_t other = side < 0 ? end - 1 : end + 1;
    slope = std::log(ys[end] / ys[other]) / std::log(xs[end] / xs[other]);
  }
  out.plan = fmt::format("{} continued from {}", past, xs[end]);
  return ys[end] * std::pow(x / xs[end], slope);
}

// Note [busiest thread's rows]: the leave-one-out vote of one line (xs strictly increasing, its
// rows' plans) between the axis itself and the busiest thread's rows of `threads`.
struct BusiestVote {
  int points = 0;          // interior rows of split runs whose two predictions differ
  double axis_error = 0;   // their summed |log(predicted / measured)| along the axis
  double rows_error = 0;   // the same along ceil(axis / threads)
  BusiestVote& operator+=(const BusiestVote& o) {
    points += o.points;
    axis_error += o.axis_error;
    rows_error += o.rows_error;
    return *this;
  }
  BusiestVote& operator-=(const BusiestVote& o) {
    points -= o.points;
    axis_error -= o.axis_error;
    rows_error -= o.rows_error;
    return *this;
  }
  // The plan's word (rows split over threads) stands unless the rows say otherwise.
  bool rows_win() const { return points == 0 || rows_error < axis_error; }
};

inline BusiestVote busiest_vote(const std::vector<double>& xs, const std::vector<double>& ys,
                                const std::vector<PlanRef>& plans, int threads, Interpolation method) {
  BusiestVote v;
  if (threads < 2 || plans.size() != xs.size()) return v;
  bool uneven = false;  // the two axes differ only where some split row's x is not a multiple of threads
  for (size_t i = 0; i < xs.size(); ++i)
    uneven = uneven || (split_over_threads(plans[i]) && busiest_rows(xs[i], threads) * threads != xs[i]);
  if (!uneven) return v;
  for (size_t i = 1; i + 1 < xs.size(); ++i) {
    if (!split_over_threads(plans[i])) continue;
    // Only rows whose busiest rows lie among those of the rest of their run: beyond them both
    // axes only continue a slope (from a thread's first row, where the cost of waking the
    // other threads dominates), which says nothing about the stair.
    const auto sig = plan_signature(plans[i]);
    size_t a = i, b = i;
    while (a > 0 && plan_signature(plans[a - 1]) == sig) --a;
    while (b + 1 < xs.size() && plan_signature(plans[b + 1]) == sig) ++b;
    const double r = busiest_rows(xs[i], threads);
    const double r_lo = busiest_rows(xs[a == i ? i + 1 : a], threads);
    const double r_hi = busiest_rows(xs[b == i ? i - 1 : b], threads);
    if (a == b || r < r_lo || r > r_hi) continue;
    std::vector<double> rx, ry;
    std::vector<PlanRef> rp;
    for (size_t j = 0; j < xs.size(); ++j)
      if (j != i) {
        rx.push_back(xs[j]);
        ry.push_back(ys[j]);
        rp.push_back(plans[j]);
      }
    const double along_axis = interp_line_planned(rx, ry, rp, xs[i], method);
    const double along_rows = interp_line_planned(rx, ry, rp, xs[i], method, nullptr, threads);
    if (std::abs(along_rows / along_axis - 1) < 1e-12) continue;
    ++v.points;
    v.axis_error += std::abs(std::log(along_axis / ys[i]));
    v.rows_error += std::abs(std::log(along_rows / ys[i]));
  }
  return v;
}

// Both axes inside a 2-axis grid (Note [two axes by lines] in src/perfdb/database.cpp): `lines`
// maps each stored value of the first axis to its line (second-axis values strictly increasing,
// values > 0); the one-axis rule along the second axis at x1 on every line whose values bracket
// x1, then along the first axis at x0 through those answers. nullopt when fewer than two lines
// bracket x1 or their first-axis values do not bracket x0. `used` collects the rules that answered.
using AxisLines = std::map<int64_t, std::pair<std::vector<double>, std::vector<double>>>;
inline std::optional<double> interp_by_lines(const AxisLines& lines, double x0, double x1, Interpolation method,
                                             std::set<Interpolation>* used = nullptr) {
  std::vector<double> outer_x, outer_y;
  for (const auto& [v, line] : lines) {
    const std::vector<double>& xs = line.first;
    if (xs.size() < 2 || !(xs.front() < x1 && x1 < xs.back())) continue;
    Interpolation rule = method;
    outer_x.push_back(double(v));
    outer_y.push_back(interp_line(xs, line.second, x1, method, &rule));
    if (used) used->insert(rule);
  }
  if (outer_x.size() < 2 || !(outer_x.front() < x0 && x0 < outer_x.back())) return std::nullopt;
  Interpolation rule = method;
  const double y = interp_line(outer_x, outer_y, x0, method, &rule);
  if (used) used->insert(rule);
  return y;
}

// "a=1, b=2" in the table's column order.
std::string dims_text(const Dims& dims, const std::vector<std::string>& order);

// The threads the table's device ran on: the "(T threads)" that `opforge collect` writes at the
// end of a CPU's name (src/perfdb/collect.cpp); 0 where the header does not say (a GPU).
int device_threads(const FileHeader& h);

// The lines of `t` along `axis`: rows of one impl, dtype and every other dim, sorted by the axis.
std::vector<std::vector<const Row*>> axis_lines(const OpTable& t, const std::string& axis);

// Note [busiest thread's rows]: busiest_vote of every line of `t` along `axis` (axis_lines),
// summed per impl, with the threads of the table's device (nothing where it does not say).
std::map<std::string, BusiestVote> busiest_votes(const OpTable& t, const std::string& axis, Interpolation method);

}  // namespace opforge::perfdb::detail
