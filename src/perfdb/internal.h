// Pieces shared by the perfdb sources (not installed).
#pragma once

#include <cmath>
#include <string>
#include <vector>

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

// y at x along a line of stored points (xs strictly increasing, all xs and ys > 0, xs.front() <
// x < xs.back()) by `method`: monotone cubic in log-log (Note above) or log y linear in log x
// between the two neighbours of x.
inline double interp_line(const std::vector<double>& xs, const std::vector<double>& ys, double x, Interpolation method) {
  if (method == Interpolation::log_linear || xs.size() == 2) {
    size_t i = 0;
    while (i + 2 < xs.size() && x > xs[i + 1]) ++i;
    return log_interp(xs[i], ys[i], xs[i + 1], ys[i + 1], x);
  }
  std::vector<double> lx(xs.size()), ly(ys.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    lx[i] = std::log(xs[i]);
    ly[i] = std::log(ys[i]);
  }
  return std::exp(hermite_at(lx, ly, pchip_slopes(lx, ly), std::log(x)));
}

// "a=1, b=2" in the table's column order.
std::string dims_text(const Dims& dims, const std::vector<std::string>& order);

}  // namespace opforge::perfdb::detail
