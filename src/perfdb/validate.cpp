// Leave-one-out validation of a system's tables (`opforge perfdb validate`).
//
// Note [leave-one-out]: for every op, impl and dtype, and along each axis separately, the rows
// that share every other dim form a line sorted by that axis.
//   - Interior rows (a stored neighbour on both sides of the line) are predicted from the rest of
//     the line by the database's interpolation (Database::interpolation(), Notes [fixed cost plus
//     power law] and [monotone cubic in log-log] in src/perfdb/internal.h), exactly as a query
//     would answer with that row removed and the other axis on its stored value (the row is out
//     of its table's vote on the busiest thread's rows too, Note [busiest thread's rows] there);
//     |predicted - measured| / measured is recorded. The same rows are also predicted by the
//     plain rule (log time linear in log axis between the two neighbours), so that one run shows
//     both. These are the numbers the goal (median <= 3%,
//     p90 <= 8%) is about: interpolation inside the grid.
//   - The two ends of every line with >= 2 rows are predicted from their neighbour on the line by
//     the query's extrapolation rule (the roofline fraction held, the roofline from the bytes and
//     flops stored with the rows and the file's ceilings), when the neighbour is at most 4x away
//     (farther, a query would refuse: not counted). Reported apart, the last rows (beyond the
//     grid) and the first (below it): a grid end left out is a test of extrapolation, a coarser
//     rule the goal is not about, and below the grid a launch-bound kernel does not get faster
//     with its roofline time as the rule assumes.
// On a 2-axis table a row counts once per axis along which it is interior (or an end). Per op and
// group: the number of predictions, their median, their 90th percentile (linear between order
// statistics) and the worst one.
//   - On a 2-axis table, leaving one row out never puts a query inside both axes (its values stay
//     stored on its other rows). So each row inside both axes is also predicted with every row
//     sharing its first-axis value or its second-axis value left out, both axes then inside, by
//     the query's rule for that case (Note [two axes by lines] in src/perfdb/database.cpp) and by
//     the plain rule (bilinear in the logs of the four nearest corners), where those corners are
//     stored (else a query would refuse). Reported apart, as "both axes".
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "opforge/perfdb.h"
#include "perfdb/internal.h"

namespace opforge::perfdb {

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = p * double(v.size() - 1);
  size_t i = size_t(pos);
  if (i + 1 >= v.size()) return v.back();
  return v[i] + (pos - double(i)) * (v[i + 1] - v[i]);
}

struct Errors {
  std::vector<double> errors;
  ValidationStats stats;
  std::vector<ValidationPoint>* points = nullptr;  // when set, every prediction is listed there
  void add(double predicted, const Row& r, const OpTable& t, const std::string& axis) {
    double err = std::abs(predicted - r.median_us) / r.median_us;
    errors.push_back(err);
    auto where = [&] { return r.impl + " " + r.dtype + " " + detail::dims_text(r.dims, t.dim_names) + " along " + axis; };
    if (points) points->push_back({where(), predicted, r.median_us});
    if (err >= stats.max_rel_err) {
      stats.max_rel_err = err;
      stats.worst = where();
    }
  }
  ValidationStats done() {
    stats.points = int(errors.size());
    stats.median_rel_err = percentile(errors, 0.5);
    stats.p90_rel_err = percentile(errors, 0.9);
    return stats;
  }
};

double roofline_us(const Row& r, const FileHeader& h) {
  double t = h.ceiling_gbps > 0 ? r.bytes / (h.ceiling_gbps * 1e3) : 0;
  if (h.ceiling_gflops > 0) t = std::max(t, r.flops / (h.ceiling_gflops * 1e3));
  return t;
}

}  // namespace

std::vector<ValidationRow> leave_one_out(const Database& db) {
  std::vector<ValidationRow> out;
  for (const std::string& op : db.ops()) {
    const OpTable& t = db.table(op);
    ValidationRow v;
    v.op = op;
    Errors chosen, plain, beyond, below;
    chosen.points = &v.interior;
    const int threads = detail::device_threads(t.header);
    for (const std::string& axis : t.header.axes) {
      // Note [busiest thread's rows]: each impl's vote, less the left-out row's part in it.
      const std::map<std::string, detail::BusiestVote> votes = detail::busiest_votes(t, axis, db.interpolation());
      for (const std::vector<const Row*>& line : detail::axis_lines(t, axis)) {
        auto arrays = [&](size_t skip, std::vector<double>& xs, std::vector<double>& ys,
                          std::vector<detail::PlanRef>& plans) {
          for (size_t j = 0; j < line.size(); ++j) {
            if (j == skip) continue;
            xs.push_back(double(line[j]->dims.at(axis)));
            ys.push_back(line[j]->median_us);
            plans.push_back(&line[j]->plan);
          }
        };
        std::vector<double> all_x, all_y;
        std::vector<detail::PlanRef> all_plans;
        arrays(line.size(), all_x, all_y, all_plans);
        const auto vote = votes.find(line.front()->impl);
        const detail::BusiestVote line_vote = detail::busiest_vote(all_x, all_y, all_plans, threads, db.interpolation());
        for (size_t i = 1; i + 1 < line.size(); ++i) {
          std::vector<double> xs, ys;
          std::vector<detail::PlanRef> plans;
          arrays(i, xs, ys, plans);
          detail::BusiestVote without = vote != votes.end() ? vote->second : detail::BusiestVote{};
          without -= line_vote;
          without += detail::busiest_vote(xs, ys, plans, threads, db.interpolation());
          const double x = double(line[i]->dims.at(axis));
          chosen.add(detail::interp_line_planned(xs, ys, plans, x, db.interpolation(), nullptr,
                                                 without.rows_win() ? threads : 0),
                     *line[i], t, axis);
          plain.add(detail::interp_line(xs, ys, x, Interpolation::log_linear), *line[i], t, axis);
        }
        if (line.size() < 2) continue;
        for (size_t i : {size_t(0), line.size() - 1}) {
          const Row& end = *line[i];
          const Row& next = *line[i == 0 ? 1 : line.size() - 2];
          double ratio = double(end.dims.at(axis)) / double(next.dims.at(axis));
          double roof_end = roofline_us(end, t.header), roof_next = roofline_us(next, t.header);
          if (std::max(ratio, 1 / ratio) > 4.0 || !(roof_end > 0 && roof_next > 0)) continue;
          (i == 0 ? below : beyond).add(next.median_us * roof_end / roof_next, end, t, axis);
        }
      }
    }
    Errors both, both_plain;
    if (t.header.axes.size() == 2) {
      const std::string& a0 = t.header.axes[0];
      const std::string& a1 = t.header.axes[1];
      // Groups: (impl, dtype, every non-axis dim) -> (axis-0 value, axis-1 value) -> row.
      std::map<std::pair<std::string, std::vector<int64_t>>, std::map<std::pair<int64_t, int64_t>, const Row*>> groups;
      for (const Row& r : t.rows) {
        std::vector<int64_t> others;
        for (const std::string& d : t.dim_names)
          if (d != a0 && d != a1) others.push_back(r.dims.at(d));
        groups[{r.impl + "," + r.dtype, others}][{r.dims.at(a0), r.dims.at(a1)}] = &r;
      }
      for (const auto& [key, g] : groups) {
        for (const auto& [at, row] : g) {
          detail::AxisLines lines;
          std::set<int64_t> v0, v1;
          for (const auto& [other, r] : g) {  // sorted by (axis 0, axis 1)
            if (other.first == at.first || other.second == at.second) continue;
            lines[other.first].first.push_back(double(other.second));
            lines[other.first].second.push_back(r->median_us);
            v0.insert(other.first);
            v1.insert(other.second);
          }
          auto hi0 = v0.upper_bound(at.first), hi1 = v1.upper_bound(at.second);
          if (hi0 == v0.begin() || hi0 == v0.end() || hi1 == v1.begin() || hi1 == v1.end()) continue;
          const int64_t lo0 = *std::prev(hi0), lo1 = *std::prev(hi1);
          const Row* corner[2][2] = {};
          bool corners = true;
          for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) {
              auto it = g.find({i ? *hi0 : lo0, j ? *hi1 : lo1});
              corners = corners && it != g.end();
              if (it != g.end()) corner[i][j] = it->second;
            }
          if (!corners) continue;
          const double x0 = double(at.first), x1 = double(at.second);
          std::optional<double> by_lines = detail::interp_by_lines(lines, x0, x1, db.interpolation());
          if (!by_lines) continue;
          const double w0 = detail::log_weight(double(lo0), double(*hi0), x0);
          const double w1 = detail::log_weight(double(lo1), double(*hi1), x1);
          double log_t = 0;
          for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j)
              log_t += (i ? w0 : 1 - w0) * (j ? w1 : 1 - w1) * std::log(corner[i][j]->median_us);
          both.add(*by_lines, *row, t, a0 + " and " + a1);
          both_plain.add(std::exp(log_t), *row, t, a0 + " and " + a1);
        }
      }
    }
    ValidationStats s = chosen.done();
    v.points = s.points;
    v.median_rel_err = s.median_rel_err;
    v.p90_rel_err = s.p90_rel_err;
    v.max_rel_err = s.max_rel_err;
    v.worst = s.worst;
    v.log_linear = plain.done();
    v.beyond = beyond.done();
    v.below = below.done();
    v.both_axes = both.done();
    v.both_axes_plain = both_plain.done();
    out.push_back(v);
  }
  return out;
}

}  // namespace opforge::perfdb
