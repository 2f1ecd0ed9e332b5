// Leave-one-out validation of a system's tables (`opforge perfdb validate`).
//
// Note [leave-one-out]: for every op, impl and dtype, and along each axis separately, the rows
// that share every other dim form a line sorted by that axis. Each row with a stored neighbour on
// both sides of that line is predicted from those two neighbours by the query's interpolation
// (log time linear in log axis) as if the row were not stored, and |predicted - measured| /
// measured is recorded. On a 2-axis table a row counts once per axis along which it is interior
// (the other axis held fixed, exactly what a query with that row removed and the other axis on a
// stored value does). Extrapolation is not validated here. Per op: the number of predictions,
// their median and their 90th percentile (linear between order statistics).
#include <algorithm>
#include <cmath>

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

}  // namespace

std::vector<ValidationRow> leave_one_out(const Database& db) {
  std::vector<ValidationRow> out;
  for (const std::string& op : db.ops()) {
    const OpTable& t = db.table(op);
    std::vector<double> errors;
    ValidationRow v;
    for (const std::string& axis : t.header.axes) {
      // Lines: (impl, dtype, every other dim) -> rows sorted by the axis.
      std::map<std::pair<std::string, std::vector<int64_t>>, std::vector<const Row*>> lines;
      for (const Row& r : t.rows) {
        std::vector<int64_t> others;
        for (const std::string& d : t.dim_names)
          if (d != axis) others.push_back(r.dims.at(d));
        lines[{r.impl + "," + r.dtype, others}].push_back(&r);
      }
      for (auto& [key, line] : lines) {
        std::sort(line.begin(), line.end(),
                  [&](const Row* a, const Row* b) { return a->dims.at(axis) < b->dims.at(axis); });
        for (size_t i = 1; i + 1 < line.size(); ++i) {
          const Row &lo = *line[i - 1], &mid = *line[i], &hi = *line[i + 1];
          double pred = detail::log_interp(double(lo.dims.at(axis)), lo.median_us, double(hi.dims.at(axis)),
                                           hi.median_us, double(mid.dims.at(axis)));
          double err = std::abs(pred - mid.median_us) / mid.median_us;
          errors.push_back(err);
          if (err >= v.max_rel_err) {
            v.max_rel_err = err;
            v.worst = mid.impl + " " + mid.dtype + " " + detail::dims_text(mid.dims, t.dim_names) + " along " + axis;
          }
        }
      }
    }
    v.op = op;
    v.points = int(errors.size());
    v.median_rel_err = percentile(errors, 0.5);
    v.p90_rel_err = percentile(errors, 0.9);
    out.push_back(v);
  }
  return out;
}

}  // namespace opforge::perfdb
