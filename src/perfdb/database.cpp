// The performance database: loading a system's tables and answering queries by the rule in
// include/opforge/perfdb.h (measured / interpolated in log-log / extrapolated at a constant
// fraction of the roofline, never from another op's data).
//
// Note [perf data root]: where Database::load looks when no root is given, first match wins:
//   1. $OPFORGE_PERF_DATA (non-empty);
//   2. walking up from the running executable's folder, then from the current folder: the first
//      ancestor holding data/perf/ (a checkout or build tree) or share/opforge/perf/ (an install
//      prefix, found relative to bin/);
//   3. the installed share folder this build was configured with (<prefix>/share/opforge/perf).
// A root (given or from $OPFORGE_PERF_DATA) may be the perf folder itself (holding <system>/
// folders) or a folder holding data/perf/ (a checkout).
//
// Note [shapes off the grid]: a query whose non-axis dims (hidden, vocab, a GEMM's n and k, head
// counts) match no stored row of the impl is answered from the same op's other shapes:
//   1. Two stored shapes equal to the query but in one dim, the nearest below and above its
//      value (hidden 2048 and 4096 for 3584): each answers for the query's axes, then log time
//      linear in log dim between them (exact on a power law of the dim, and it keeps a launch-
//      bound time flat); method interpolated (or extrapolated when either was), `how` giving both
//      answers and "shape interpolated in hidden between 2048 and 4096 (linear in log-log)".
//   2. Else a stored shape within 4x of the query on every one of those dims: its answer times
//      the ratio of the two shapes' roofline times max(bytes / ceiling_gbps, flops /
//      ceiling_gflops) from the op's cost model, i.e. the achieved roofline fraction held, as
//      extrapolation along an axis does; method extrapolated, `how` ending e.g. "shape scaled
//      from hidden=4096 to hidden=3584 by the roofline time (0.875x, fraction 0.93 held)". Of
//      those shapes, the one whose roofline time is nearest the query's (the smallest |log| of
//      the ratio; ties: the nearest in the sum of |log| ratios of the dims): the fraction is held
//      across the smallest change of work. Gemma-2-9B's attention (16 / 8 heads x 256) is thus
//      scaled from 32 / 8 x 128 (the same query-key work, twice the KV bytes), not from
//      16 / 4 x 128, as near in dims but twice (prefill) or four times (decode) the work away.
// This lets the estimator cost a model whose dims were not collected (Qwen2-7B's hidden 3584,
// Mistral's vocab 32768) from the same op's data; further than 4x, or with no cost model, it
// stays not available. With impl "auto", an impl that holds the query's shape answers before any
// other.
//
// Note [kernels that cannot run the shape]: a kernel whose rows exist may still refuse the query's
// shape (cuda_split_mma takes head_dim 64 and 128; Gemma-2-9B's decode has 256), and the shape
// rule above would happily scale its rows there. So each candidate impl is first asked, through
// its own predicate on the call's arguments as shape-only views (perfdb::kernel_refusal):
//   - an explicit impl that refuses: PerfDataNotAvailable naming the predicate's reason;
//   - with "auto", impls that take the shape answer first, by the rule above;
//   - only when every impl with an answer refuses, the fastest of those answers stands in for the
//     kernel the registry would run there (perfdb::kernel_that_runs): `impl` reads
//     "cuda_split_async (data: cuda_split_mma)", `how` says why, `stand_in_for` names it, and the
//     method is at least extrapolated. The time is then that of another kernel at another shape:
//     good where both stream the same bytes near the copy ceiling (Gemma-2-9B's decode layers
//     within 6% of the measured ones, docs/perf/estimator.md), a guess elsewhere.
// A build without the kernel (a CPU-only build reading a GPU database) cannot ask it, and answers
// as if it took the shape.
//
// Note [two axes by lines]: a query inside the grid on both axes of a 2-axis table is answered
// by the one-axis rule twice: along the second axis on every stored line of the first axis whose
// second-axis values bracket the query (each line's own stored points), then along the first
// axis through those answers. The four corners around the query must be stored, as for the
// bilinear rule it replaces (which Interpolation::log_linear keeps). Each step is exact on a power
// law and, by default, on a fixed cost plus a power law, so the whole is exact on
// c * x^p * y^q and on a + b * x^p * y^q (decode: a launch cost plus batch x context of KV
// reads); bilinear interpolation of the logs of four corners is exact on the first only. Leaving
// out a row's whole batch and context (or batch and tokens) and predicting it this way, on the
// H200 data of 2026-11-26: attention_decode median / p90 15.5% / 34.3% (bilinear) -> 6.5% /
// 27.7%, attention_prefill 30.1% / 41.2% -> 17.3% / 28.9%.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "opforge/dtype.h"
#include "opforge/perfdb.h"
#include "perfdb/internal.h"

#ifndef OPFORGE_PERF_DATA_DIR
#define OPFORGE_PERF_DATA_DIR ""
#endif

namespace opforge::perfdb {

namespace fs = std::filesystem;

const char* method_name(Method m) {
  switch (m) {
    case Method::measured: return "measured";
    case Method::interpolated: return "interpolated";
    case Method::extrapolated: return "extrapolated";
    case Method::modelled: return "modelled";
  }
  return "?";
}

const char* interpolation_name(Interpolation m) {
  switch (m) {
    case Interpolation::floor_power: return "fixed cost plus power law";
    case Interpolation::monotone_cubic: return "monotone cubic in log-log";
    case Interpolation::log_linear: return "linear in log-log";
  }
  return "?";
}

std::string detail::dims_text(const Dims& dims, const std::vector<std::string>& order) {
  std::string s;
  for (const std::string& d : order)
    if (auto it = dims.find(d); it != dims.end()) s += fmt::format("{}{}={}", s.empty() ? "" : ", ", d, it->second);
  for (const auto& [d, v] : dims)  // names outside `order` (a malformed query) still show
    if (std::find(order.begin(), order.end(), d) == order.end()) s += fmt::format("{}{}={}", s.empty() ? "" : ", ", d, v);
  return s;
}

int detail::device_threads(const FileHeader& h) {
  const std::string& d = h.device;
  const size_t open = d.rfind('(');
  if (open == std::string::npos) return 0;
  int threads = 0;
  const char* first = d.data() + open + 1;
  const char* last = d.data() + d.size();
  auto [p, ec] = std::from_chars(first, last, threads);
  const std::string rest(p, last);
  if (ec != std::errc() || !(rest == " threads)" || rest == " thread)")) return 0;
  return threads;
}

std::vector<std::vector<const Row*>> detail::axis_lines(const OpTable& t, const std::string& axis) {
  std::map<std::pair<std::string, std::vector<int64_t>>, std::vector<const Row*>> lines;
  for (const Row& r : t.rows) {
    std::vector<int64_t> others;
    for (const std::string& d : t.dim_names)
      if (d != axis) others.push_back(r.dims.at(d));
    lines[{r.impl + "," + r.dtype, others}].push_back(&r);
  }
  std::vector<std::vector<const Row*>> out;
  for (auto& [key, line] : lines) {
    std::sort(line.begin(), line.end(), [&](const Row* a, const Row* b) { return a->dims.at(axis) < b->dims.at(axis); });
    out.push_back(std::move(line));
  }
  return out;
}

std::map<std::string, detail::BusiestVote> detail::busiest_votes(const OpTable& t, const std::string& axis,
                                                                 Interpolation method) {
  std::map<std::string, BusiestVote> votes;
  const int threads = device_threads(t.header);
  if (threads < 2) return votes;
  for (const std::vector<const Row*>& line : axis_lines(t, axis)) {
    std::vector<double> xs, ys;
    std::vector<PlanRef> plans;
    for (const Row* r : line) {
      xs.push_back(double(r->dims.at(axis)));
      ys.push_back(r->median_us);
      plans.push_back(&r->plan);
    }
    votes[line.front()->impl] += busiest_vote(xs, ys, plans, threads, method);
  }
  return votes;
}

namespace {

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s.empty() ? "none" : s;
}

template <class Set>
std::string join_set(const Set& set) {
  return join(std::vector<std::string>(set.begin(), set.end()));
}

fs::path perf_folder_of(const fs::path& root) {
  std::error_code ec;
  if (fs::is_directory(root / "data" / "perf", ec)) return root / "data" / "perf";
  return root;
}

std::optional<fs::path> find_upwards(fs::path start) {
  std::error_code ec;
  for (fs::path p = start; !p.empty(); p = p.parent_path()) {
    if (fs::is_directory(p / "data" / "perf", ec)) return p / "data" / "perf";
    if (fs::is_directory(p / "share" / "opforge" / "perf", ec)) return p / "share" / "opforge" / "perf";
    if (p == p.parent_path()) break;
  }
  return std::nullopt;
}

// The 1-based line of a "# key:" header line (for errors about a loaded file's header).
int header_line(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n)
    if (line.rfind("# " + key + ":", 0) == 0) return n;
  return 1;
}

std::string canonical_dtype(const std::string& dtype) {
  try {
    return dtype_name(parse_dtype(dtype));
  } catch (const Error&) {
    return dtype;  // never stored: the query reports it as not measured
  }
}

// Where a query value lies along one axis of the stored values.
struct Bracket {
  enum Kind { exact, inside, outside } kind = exact;
  int64_t lo = 0, hi = 0;  // inside: neighbours; outside: lo == hi == the nearest stored value
  double ratio = 1;        // outside: how far beyond (>= 1)
  bool above = false;      // outside: beyond the largest (else below the smallest)
};

struct Attempt {
  bool ok = false;
  Answer answer;
  double reach = 1;            // ok: the largest extrapolation ratio used (1: none)
  bool shape_scaled = false;   // ok: answered from other non-axis dims (Note [shapes off the grid])
  std::string why;             // !ok: what is missing
};

Attempt answer_on_grid(const OpTable& t, const std::string& op, const std::string& impl, const std::string& dtype,
                       const Dims& q, const CostFn& cost, Interpolation interp, const std::vector<const Row*>& match,
                       int held, const std::set<std::string>& busiest);

double roofline_us(const Cost& c, const FileHeader& h) {
  double t = c.bytes / (h.ceiling_gbps * 1e3);                          // bytes / (GB/s) in us
  if (h.ceiling_gflops > 0) t = std::max(t, c.flops / (h.ceiling_gflops * 1e3));  // flops / (GFLOP/s)
  return t;
}

// `busiest`: the axes along which this impl's rows follow the busiest thread's rows (Note
// [busiest thread's rows] in src/perfdb/internal.h).
Attempt answer_impl(const OpTable& t, const std::string& op, const std::string& impl, const std::string& dtype,
                    const Dims& q, const CostFn& cost, Interpolation interp, const std::set<std::string>& busiest) {
  Attempt out;
  const std::vector<std::string>& axes = t.header.axes;
  std::vector<std::string> fixed;  // the non-axis dims
  for (const std::string& d : t.dim_names)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) fixed.push_back(d);

  std::vector<const Row*> rows, match;
  for (const Row& r : t.rows)
    if (r.impl == impl && r.dtype == dtype) rows.push_back(&r);
  for (const Row* r : rows) {
    bool same = true;
    for (const std::string& d : fixed) same = same && r->dims.at(d) == q.at(d);
    if (same) match.push_back(r);
  }
  if (match.empty()) {
    // The stored combinations of the non-axis dims, nearest (in log distance) first.
    std::map<std::vector<int64_t>, double> combos;
    for (const Row* r : rows) {
      std::vector<int64_t> key;
      double dist = 0;
      for (const std::string& d : fixed) {
        key.push_back(r->dims.at(d));
        dist += std::abs(std::log(double(r->dims.at(d)) / double(q.at(d))));
      }
      combos[key] = dist;
    }
    std::vector<std::pair<double, std::vector<int64_t>>> order;
    for (const auto& [k, dist] : combos) order.push_back({dist, k});
    std::sort(order.begin(), order.end());
    std::vector<std::string> shown;
    for (size_t i = 0; i < order.size() && i < 5; ++i) {
      Dims d;
      for (size_t j = 0; j < fixed.size(); ++j) d[fixed[j]] = order[i].second[j];
      shown.push_back(detail::dims_text(d, fixed));
    }
    Dims asked;
    for (const std::string& d : fixed) asked[d] = q.at(d);
    out.why = fmt::format("no stored row with {} (nearest stored: {}{})", detail::dims_text(asked, fixed),
                          join(shown, "; "), order.size() > shown.size() ? "; ..." : "");
    // Note [shapes off the grid]: between two stored shapes that differ from the query in one dim
    // only, log time linear in log dim; else the nearest stored shape within 4x on every non-axis
    // dim, scaled by the ratio of the two shapes' roofline times.
    for (size_t j = 0; j < fixed.size(); ++j) {
      const int64_t x = q.at(fixed[j]);
      int64_t lo = 0, hi = 0;
      for (const auto& [dist, key] : order) {
        bool others = true;
        for (size_t i = 0; i < fixed.size(); ++i) others = others && (i == j || key[i] == q.at(fixed[i]));
        if (!others) continue;
        if (key[j] < x && key[j] > lo) lo = key[j];
        if (key[j] > x && (hi == 0 || key[j] < hi)) hi = key[j];
      }
      if (lo == 0 || hi == 0) continue;
      Dims at_lo = q, at_hi = q;
      at_lo[fixed[j]] = lo;
      at_hi[fixed[j]] = hi;
      Attempt a = answer_impl(t, op, impl, dtype, at_lo, cost, interp, busiest);
      Attempt b = answer_impl(t, op, impl, dtype, at_hi, cost, interp, busiest);
      if (!a.ok || !b.ok) continue;
      const double w = std::log(double(x) / double(lo)) / std::log(double(hi) / double(lo));
      auto blend = [&](double u, double v) { return std::exp((1 - w) * std::log(u) + w * std::log(v)); };
      Attempt out2 = a;
      out2.answer.us = blend(a.answer.us, b.answer.us);
      out2.answer.energy_uj.reset();
      if (a.answer.energy_uj && b.answer.energy_uj && *a.answer.energy_uj > 0 && *b.answer.energy_uj > 0)
        out2.answer.energy_uj = blend(*a.answer.energy_uj, *b.answer.energy_uj);
      out2.answer.method = std::max({a.answer.method, b.answer.method, Method::interpolated});
      out2.answer.how = fmt::format("{} at {}={} and {} at {}={}; shape interpolated in {} between {} and {} "
                                    "(linear in log-log)",
                                    a.answer.how, fixed[j], lo, b.answer.how, fixed[j], hi, fixed[j], lo, hi);
      out2.reach = std::max(a.reach, b.reach);
      out2.shape_scaled = true;
      return out2;
    }
    // Candidates within 4x on every such dim, the least scaled first (the smallest |log| of the
    // roofline ratio; then the nearest in dims): the achieved fraction is held best across the
    // smallest change of work.
    struct Candidate {
      double log_scale, dist, furthest, scale, roof_stored;
      Dims at;
    };
    std::vector<Candidate> candidates;
    for (const auto& [dist, key] : order) {
      Dims at = q;
      double furthest = 1;
      for (size_t j = 0; j < fixed.size(); ++j) {
        at[fixed[j]] = key[j];
        const double x = double(q.at(fixed[j])), y = double(key[j]);
        furthest = std::max(furthest, std::max(x / y, y / x));
      }
      if (furthest > 4.0) continue;
      Cost at_stored, at_query;
      try {
        at_stored = cost(op, dtype, at);
        at_query = cost(op, dtype, q);
      } catch (const std::exception&) {
        continue;
      }
      const double roof_stored = roofline_us(at_stored, t.header), roof_query = roofline_us(at_query, t.header);
      if (!(roof_stored > 0 && roof_query > 0 && std::isfinite(roof_stored) && std::isfinite(roof_query))) continue;
      const double scale = roof_query / roof_stored;
      candidates.push_back({std::abs(std::log(scale)), dist, furthest, scale, roof_stored, at});
    }
    std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
      return a.log_scale != b.log_scale ? a.log_scale < b.log_scale : a.dist < b.dist;
    });
    for (const Candidate& c : candidates) {
      Attempt a = answer_impl(t, op, impl, dtype, c.at, cost, interp, busiest);
      if (!a.ok) continue;
      Dims from, to;
      for (const std::string& d : fixed)
        if (c.at.at(d) != q.at(d)) from[d] = c.at.at(d), to[d] = q.at(d);
      a.answer.how += fmt::format("; shape scaled from {} to {} by the roofline time ({:.3f}x, fraction {:.2f} held)",
                                  detail::dims_text(from, fixed), detail::dims_text(to, fixed), c.scale,
                                  c.roof_stored / a.answer.us);
      a.answer.us *= c.scale;
      if (a.answer.energy_uj) *a.answer.energy_uj *= c.scale;
      a.answer.method = Method::extrapolated;
      a.reach = std::max(a.reach, c.furthest);
      a.shape_scaled = true;
      return a;
    }
    return out;
  }

  // On two axes, an axis whose query value is stored may be held there, bracketing the other axis
  // among the rows on that line only (a grid need not be rectangular). Every way is tried; the
  // best answer wins: measured, then interpolated, then the least extrapolated.
  std::vector<int> holds;
  if (axes.size() == 2)
    for (int a = 0; a < 2; ++a)
      if (std::any_of(match.begin(), match.end(), [&](const Row* r) { return r->dims.at(axes[a]) == q.at(axes[a]); }))
        holds.push_back(a);
  holds.push_back(-1);
  std::optional<Attempt> best;
  std::vector<std::string> why;
  for (int held : holds) {
    Attempt a = answer_on_grid(t, op, impl, dtype, q, cost, interp, match, held, busiest);
    if (!a.ok) {
      if (std::find(why.begin(), why.end(), a.why) == why.end()) why.push_back(a.why);
    } else if (!best || a.answer.method < best->answer.method ||
               (a.answer.method == best->answer.method && a.reach < best->reach)) {
      best = a;
    }
  }
  if (best) return *best;
  out.why = join(why, "; ");
  return out;
}

Attempt answer_on_grid(const OpTable& t, const std::string& op, const std::string& impl, const std::string& dtype,
                       const Dims& q, const CostFn& cost, Interpolation interp, const std::vector<const Row*>& match,
                       int held, const std::set<std::string>& busiest) {
  Attempt out;
  const std::vector<std::string>& axes = t.header.axes;
  std::vector<Bracket> br(axes.size());
  for (size_t a = 0; a < axes.size(); ++a) {
    std::set<int64_t> values;
    for (const Row* r : match)
      if (held < 0 || size_t(held) == a || r->dims.at(axes[held]) == q.at(axes[held])) values.insert(r->dims.at(axes[a]));
    std::vector<std::string> listed;
    for (int64_t v : values) listed.push_back(std::to_string(v));
    int64_t x = q.at(axes[a]);
    Bracket& b = br[a];
    int64_t first = *values.begin(), last = *values.rbegin();
    if (values.count(x)) {
      b.kind = Bracket::exact;
      b.lo = b.hi = x;
    } else if (x > first && x < last) {
      b.kind = Bracket::inside;
      b.hi = *values.upper_bound(x);
      b.lo = *std::prev(values.lower_bound(x));
    } else {
      b.kind = Bracket::outside;
      b.above = x > last;
      b.lo = b.hi = b.above ? last : first;
      b.ratio = b.above ? double(x) / double(last) : double(first) / double(x);
      if (b.ratio > 4.0) {
        std::string line = held >= 0 && size_t(held) != a ? fmt::format(" at {}={}", axes[held], q.at(axes[held])) : "";
        out.why = fmt::format("{}={} is {:.1f}x {} the {} stored {}{} {} (at most 4x); stored {}{}: {}", axes[a], x,
                              b.ratio, b.above ? "beyond" : "below", b.above ? "largest" : "smallest", axes[a], line,
                              b.lo, axes[a], line, join(listed));
        return out;
      }
      out.reach = std::max(out.reach, b.ratio);
    }
  }

  // The stored corners around the (clamped) query point; every one must be there.
  std::map<std::vector<int64_t>, const Row*> grid;
  for (const Row* r : match) {
    std::vector<int64_t> key;
    for (const std::string& a : axes) key.push_back(r->dims.at(a));
    grid[key] = r;
  }
  Dims clamped = q;
  for (size_t a = 0; a < axes.size(); ++a)
    if (br[a].kind == Bracket::outside) clamped[axes[a]] = br[a].lo;
  double log_t = 0, log_e = 0, lin_e = 0;
  bool energy = true, energy_positive = true;
  const size_t corners = size_t(1) << axes.size();
  for (size_t c = 0; c < corners; ++c) {
    std::vector<int64_t> key;
    double weight = 1;
    bool used = true;
    for (size_t a = 0; a < axes.size(); ++a) {
      bool upper = (c >> a) & 1;
      const Bracket& b = br[a];
      if (b.kind != Bracket::inside) {
        used = used && !upper;  // a single value on this axis: only the lower index counts
        key.push_back(b.lo);
        continue;
      }
      double w = detail::log_weight(double(b.lo), double(b.hi), double(q.at(axes[a])));
      weight *= upper ? w : 1 - w;
      key.push_back(upper ? b.hi : b.lo);
    }
    if (!used) continue;
    auto it = grid.find(key);
    if (it == grid.end()) {
      Dims corner = clamped;
      for (size_t a = 0; a < axes.size(); ++a) corner[axes[a]] = key[a];
      out.why = fmt::format("the stored point {} needed to interpolate is missing", detail::dims_text(corner, t.dim_names));
      return out;
    }
    const Row& r = *it->second;
    log_t += weight * std::log(r.median_us);
    if (r.energy_uj) {
      energy_positive = energy_positive && *r.energy_uj > 0;
      if (*r.energy_uj > 0) log_e += weight * std::log(*r.energy_uj);
      lin_e += weight * *r.energy_uj;
    } else {
      energy = false;
    }
  }
  Answer& ans = out.answer;
  ans.impl = impl;
  ans.us = std::exp(log_t);
  if (energy) ans.energy_uj = energy_positive ? std::exp(log_e) : lin_e;
  // One axis inside: along the line of stored rows through the bracket (every other axis at its
  // stored or clamped value), by the database's interpolation (Note [monotone cubic in log-log]).
  std::string line_method;
  const auto n_inside = std::count_if(br.begin(), br.end(), [](const Bracket& b) { return b.kind == Bracket::inside; });
  if (n_inside == 1) {
    size_t ia = 0;
    while (br[ia].kind != Bracket::inside) ++ia;
    std::vector<double> xs, ts, es;
    std::vector<detail::PlanRef> plans;
    bool line_energy = true;
    for (const auto& [key, r] : grid) {  // sorted by key, so by axis ia among rows equal elsewhere
      bool on_line = true;
      for (size_t a = 0; a < axes.size(); ++a) on_line = on_line && (a == ia || key[a] == br[a].lo);
      if (!on_line) continue;
      xs.push_back(double(key[ia]));
      ts.push_back(r->median_us);
      plans.push_back(&r->plan);
      line_energy = line_energy && r->energy_uj && *r->energy_uj > 0;
      es.push_back(r->energy_uj.value_or(0));
    }
    const double x = double(q.at(axes[ia]));
    // Notes [plan lines] and [busiest thread's rows] in src/perfdb/internal.h
    const int threads = busiest.count(axes[ia]) ? detail::device_threads(t.header) : 0;
    detail::LineNote note;
    ans.us = detail::interp_line_planned(xs, ts, plans, x, interp, &note, threads, axes[ia]);
    if (energy && line_energy) ans.energy_uj = detail::interp_line_planned(xs, es, plans, x, interp, nullptr, threads);
    if (note.stored)
      line_method = fmt::format(" ({})", note.plan);
    else
      line_method = fmt::format(" ({}{}{})", interpolation_name(note.used), note.plan.empty() ? "" : "; ", note.plan);
  }
  // Both axes inside (Note [two axes by lines]): the one-axis rule along the second axis on every
  // stored line of the first axis that brackets the query, then along the first axis through
  // those answers. The plain rule keeps the bilinear interpolation of the four corners.
  bool by_lines = false;
  if (n_inside == 2 && interp != Interpolation::log_linear) {
    // axis-0 value -> its line along axis 1 (grid is sorted by key: axis 0, then axis 1)
    detail::AxisLines times, energies;
    bool lines_energy = true;
    for (const auto& [key, r] : grid) {
      times[key[0]].first.push_back(double(key[1]));
      times[key[0]].second.push_back(r->median_us);
      energies[key[0]].first.push_back(double(key[1]));
      energies[key[0]].second.push_back(r->energy_uj.value_or(0));
      lines_energy = lines_energy && r->energy_uj && *r->energy_uj > 0;
    }
    const double x0 = double(q.at(axes[0])), x1 = double(q.at(axes[1]));
    std::set<Interpolation> rules;
    if (std::optional<double> us = detail::interp_by_lines(times, x0, x1, interp, &rules)) {
      ans.us = *us;
      // energy from the same lines when every stored row has it (else the corners' answer above)
      if (energy && lines_energy) ans.energy_uj = detail::interp_by_lines(energies, x0, x1, interp);
      std::vector<std::string> names;
      for (Interpolation m : rules) names.push_back(interpolation_name(m));
      line_method = fmt::format(" ({}; along {} on each line of {}, then along {})", join(names, " / "), axes[1],
                                axes[0], axes[0]);
      by_lines = true;
    }
  }
  if (std::none_of(br.begin(), br.end(), [](const Bracket& b) { return b.kind == Bracket::inside; })) {
    std::vector<int64_t> key;  // one stored point: its values as stored, not through exp(log())
    for (const std::string& a : axes) key.push_back(clamped.at(a));
    ans.us = grid.at(key)->median_us;
    ans.energy_uj = grid.at(key)->energy_uj;
  }

  std::vector<std::string> inside, outside;
  for (size_t a = 0; a < axes.size(); ++a) {
    const Bracket& b = br[a];
    if (b.kind == Bracket::inside) inside.push_back(fmt::format("{} between {} and {}", axes[a], b.lo, b.hi));
    if (b.kind == Bracket::outside)
      outside.push_back(fmt::format("{} from {} ({:.1f}x {})", axes[a], b.lo, b.ratio, b.above ? "beyond" : "below"));
  }
  std::string how;
  if (!inside.empty())
    how = (inside.size() == 2 && !by_lines ? "bilinear in " : "interpolated in ") + join(inside, " and ") + line_method;
  ans.method = inside.empty() ? Method::measured : Method::interpolated;
  if (!outside.empty()) {
    Cost at_stored, at_query;
    try {
      at_stored = cost(op, dtype, clamped);
      at_query = cost(op, dtype, q);
    } catch (const std::exception& e) {
      out.why = fmt::format("cannot extrapolate in {}: the cost model failed: {}", join(outside, " and "), e.what());
      return out;
    }
    double roof_stored = roofline_us(at_stored, t.header), roof_query = roofline_us(at_query, t.header);
    if (!(roof_stored > 0 && roof_query > 0 && std::isfinite(roof_stored) && std::isfinite(roof_query))) {
      out.why = fmt::format("cannot extrapolate in {}: the cost model gives no bytes or flops", join(outside, " and "));
      return out;
    }
    double fraction = roof_stored / ans.us;
    double scale = roof_query / roof_stored;
    ans.us *= scale;
    if (ans.energy_uj) *ans.energy_uj *= scale;
    how += fmt::format("{}extrapolated in {}, roofline fraction {:.2f} held", how.empty() ? "" : ", ",
                       join(outside, " and "), fraction);
    ans.method = Method::extrapolated;
  }
  ans.how = how.empty() ? "measured" : how;
  out.ok = true;
  return out;
}

}  // namespace

std::string Database::resolve_root(const std::string& root) {
  if (!root.empty()) return perf_folder_of(root).string();
  if (const char* env = std::getenv("OPFORGE_PERF_DATA"); env && *env) return perf_folder_of(env).string();
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path())
    if (auto p = find_upwards(exe.parent_path())) return p->string();
  fs::path cwd = fs::current_path(ec);
  if (!ec)
    if (auto p = find_upwards(cwd)) return p->string();
  return OPFORGE_PERF_DATA_DIR;
}

std::vector<std::string> Database::systems(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::path dir = resolve_root(root);
  if (dir.empty() || !fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

Database Database::load(const std::string& system, const std::string& root) {
  std::string base = resolve_root(root);
  std::error_code ec;
  fs::path dir = fs::path(base) / system;
  bool plain_name = !system.empty() && system.find('/') == std::string::npos && system != "." && system != "..";
  if (!plain_name || base.empty() || !fs::is_directory(dir, ec))
    throw PerfDataNotAvailable(fmt::format("no performance data for system '{}' under '{}' (systems there: {})",
                                           system, base.empty() ? "(no data folder found)" : base,
                                           join(systems(base))));
  Database db;
  db.system_ = system;
  db.folder_ = dir.string();
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec) && e.path().extension() == ".csv") files.push_back(e.path());
  if (ec) throw Error(ErrorCode::io, fmt::format("{}: cannot list: {}", dir.string(), ec.message()));
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    OpTable t = read_table(p.string());
    if (t.header.system != system)
      throw Error(ErrorCode::parse, fmt::format("{}:{}: system '{}' but the file lies in the folder of system '{}'",
                                                p.string(), header_line(p.string(), "system"), t.header.system, system));
    if (t.header.op != p.stem().string())
      throw Error(ErrorCode::parse, fmt::format("{}:{}: op '{}' but the file is named for op '{}'", p.string(),
                                                header_line(p.string(), "op"), t.header.op, p.stem().string()));
    db.tables_.emplace(t.header.op, std::move(t));
  }
  db.vote_busiest();
  return db;
}

void Database::set_interpolation(Interpolation m) {
  interp_ = m;
  vote_busiest();
}

void Database::vote_busiest() {
  busiest_.clear();
  for (const auto& [op, t] : tables_)
    for (const std::string& axis : t.header.axes)
      for (const auto& [impl, vote] : detail::busiest_votes(t, axis, interp_))
        if (vote.rows_win()) busiest_.insert({op, axis, impl});
}

const OpTable& Database::table(const std::string& op) const {
  auto it = tables_.find(op);
  if (it == tables_.end())
    throw PerfDataNotAvailable(fmt::format("no performance data for op '{}' on system '{}' (ops measured there: {})",
                                           op, system_, join(ops())));
  return it->second;
}

std::vector<std::string> Database::ops() const {
  std::vector<std::string> out;
  for (const auto& [op, t] : tables_) out.push_back(op);
  return out;
}

Answer Database::query(const std::string& op, const std::string& impl, const std::string& dtype,
                       const Dims& dims) const {
  auto found = tables_.find(op);
  if (found == tables_.end())
    throw PerfDataNotAvailable(fmt::format("no performance data for op '{}' (system '{}', impl '{}', dtype '{}'): "
                                           "never measured there (ops measured: {})",
                                           op, system_, impl, dtype, join(ops())));
  const OpTable& t = found->second;
  // The query must name the table's dims: a different set is data this table does not hold.
  for (const std::string& d : t.dim_names)
    if (!dims.count(d))
      throw PerfDataNotAvailable(fmt::format("no performance data for {} (system '{}') without dim '{}': the stored "
                                             "dims are {}, the query gives {}",
                                             op, system_, d, join(t.dim_names), detail::dims_text(dims, t.dim_names)));
  for (const auto& [d, v] : dims) {
    if (std::find(t.dim_names.begin(), t.dim_names.end(), d) == t.dim_names.end())
      throw PerfDataNotAvailable(fmt::format("no performance data for {} (system '{}') by dim '{}': the stored dims "
                                             "are {}", op, system_, d, join(t.dim_names)));
    if (v <= 0)
      throw Error(ErrorCode::invalid_argument, fmt::format("perfdb query of {}: dim {}={} is not > 0", op, d, v));
  }
  const std::string dt = canonical_dtype(dtype);
  std::set<std::string> impls, impls_in_dtype, dtypes, dtypes_of_impl;
  for (const Row& r : t.rows) {
    impls.insert(r.impl);
    dtypes.insert(r.dtype);
    if (r.dtype == dt) impls_in_dtype.insert(r.impl);
    if (r.impl == impl) dtypes_of_impl.insert(r.dtype);
  }
  std::vector<std::string> candidates;
  if (impl == "auto") {
    if (impls_in_dtype.empty())
      throw PerfDataNotAvailable(fmt::format("no performance data for {} in dtype '{}' on system '{}' (dtypes measured: {})",
                                             op, dtype, system_, join_set(dtypes)));
    candidates.assign(impls_in_dtype.begin(), impls_in_dtype.end());
  } else {
    if (!impls.count(impl))
      throw PerfDataNotAvailable(fmt::format("no performance data for {} impl '{}' on system '{}' (impls measured: {})",
                                             op, impl, system_, join_set(impls)));
    if (!impls_in_dtype.count(impl))
      throw PerfDataNotAvailable(fmt::format("no performance data for {} impl '{}' in dtype '{}' on system '{}' "
                                             "(dtypes measured for {}: {})",
                                             op, impl, dtype, system_, impl, join_set(dtypes_of_impl)));
    candidates.push_back(impl);
  }
  const CostFn& cost = cost_ ? cost_ : CostFn(cost_at);
  // Note [kernels that cannot run the shape]
  const RefusalFn& refuses = refusal_ ? refusal_ : RefusalFn(kernel_refusal);
  std::map<std::string, std::string> refused;  // impl -> its predicate's reason
  for (const std::string& c : candidates)
    if (std::string r = refuses(op, c, dt, dims); !r.empty()) refused[c] = std::move(r);
  if (impl != "auto" && refused.count(impl))
    throw PerfDataNotAvailable(fmt::format("no performance data for {} impl '{}' at {} (system '{}'): that kernel "
                                           "cannot run the shape ({})",
                                           op, impl, detail::dims_text(dims, t.dim_names), system_, refused[impl]));
  // The fastest answer, from the impls that have the query's non-axis dims if any has them (a
  // shape-scaled answer never displaces one at the stored shape: Note [shapes off the grid]);
  // kernels that can run the shape first.
  std::optional<Attempt> best, best_refused;
  std::vector<std::string> why;
  for (const std::string& c : candidates) {
    std::set<std::string> busiest;
    for (const std::string& axis : t.header.axes)
      if (busiest_.count({op, axis, c})) busiest.insert(axis);
    Attempt a = answer_impl(t, op, c, dt, dims, cost, interp_, busiest);
    std::optional<Attempt>& slot = refused.count(c) ? best_refused : best;
    if (!a.ok) {
      why.push_back(candidates.size() > 1 ? c + ": " + a.why : a.why);
    } else if (!slot || (slot->shape_scaled && !a.shape_scaled) ||
               (slot->shape_scaled == a.shape_scaled && a.answer.us < slot->answer.us)) {
      slot = a;
    }
  }
  if (best) return best->answer;
  if (best_refused) {
    Answer a = best_refused->answer;
    const std::string runs = kernel_that_runs(op, a.impl, dt, dims, refusal_);
    a.how += fmt::format("; {} cannot run this shape ({}): its rows stand in for {}", a.impl, refused[a.impl],
                         runs.empty() ? std::string("a kernel that can (none named by this build)")
                                      : runs + ", the kernel that would run it, which has no answer here");
    a.method = std::max(a.method, Method::extrapolated);
    a.stand_in_for = runs;
    a.impl = runs.empty() ? a.impl + " (cannot run this shape)" : runs + " (data: " + a.impl + ")";
    return a;
  }
  throw PerfDataNotAvailable(fmt::format("no performance data for {} (system '{}', impl '{}', dtype '{}') at {}: {}", op,
                                         system_, impl, dtype, detail::dims_text(dims, t.dim_names), join(why, "; ")));
}

}  // namespace opforge::perfdb
