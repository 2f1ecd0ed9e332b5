// Reference kernels of the softmax family: plain loops in double, one rounding per output.
// Each row is read completely before its output is written, so y may alias x (in place).
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "ops/softmax/softmax.h"

namespace opforge {

namespace {

std::vector<double> read_row(const TensorView& t, int64_t row) {
  std::vector<double> v(size_t(t.size(-1)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_double(t.data, t.dtype, row * t.row_stride() + int64_t(i));
  return v;
}

void write_row(const TensorView& t, int64_t row, const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) store_from_double(t.data, t.dtype, row * t.row_stride() + int64_t(i), v[i]);
}

// Applies f(row of x) -> row of y to every row.
void forward_rows(const TensorView& y, const TensorView& x,
                  const std::function<void(std::vector<double>&)>& f) {
  for (int64_t row = 0; row < x.rows(); ++row) {
    std::vector<double> v = read_row(x, row);
    f(v);
    write_row(y, row, v);
  }
}

// Applies f(dy row, y row) -> dx row (in the dy vector) to every row.
void backward_rows(const TensorView& dx, const TensorView& dy, const TensorView& y,
                   const std::function<void(std::vector<double>&, const std::vector<double>&)>& f) {
  for (int64_t row = 0; row < y.rows(); ++row) {
    std::vector<double> g = read_row(dy, row);
    f(g, read_row(y, row));
    write_row(dx, row, g);
  }
}

// log(sum(exp(v))) computed as m + log(sum(exp(v - m))).
double log_sum_exp(const std::vector<double>& v) {
  double m = -INFINITY;
  for (double e : v) m = std::max(m, e);
  if (std::isinf(m)) return m;
  double s = 0;
  for (double e : v) s += std::exp(e - m);
  return m + std::log(s);
}

}  // namespace

void softmax_reference(const Context&, const TensorView& y, const TensorView& x) {
  forward_rows(y, x, [](std::vector<double>& v) {
    const double lse = log_sum_exp(v);
    for (double& e : v) e = std::exp(e - lse);
  });
}

void log_softmax_reference(const Context&, const TensorView& y, const TensorView& x) {
  forward_rows(y, x, [](std::vector<double>& v) {
    const double lse = log_sum_exp(v);
    for (double& e : v) e -= lse;
  });
}

// tau from the sorted row: the support is the largest k with 1 + k z_(k) > sum of the k largest.
void sparsemax_reference(const Context&, const TensorView& y, const TensorView& x) {
  forward_rows(y, x, [](std::vector<double>& v) {
    std::vector<double> z = v;
    std::sort(z.begin(), z.end(), std::greater<double>());
    double cumsum = 0, support_sum = 0;
    int64_t k = 0;
    for (size_t i = 0; i < z.size(); ++i) {
      cumsum += z[i];
      if (1.0 + double(i + 1) * z[i] > cumsum) {
        k = int64_t(i + 1);
        support_sum = cumsum;
      }
    }
    const double tau = (support_sum - 1.0) / double(k);
    for (double& e : v) e = std::max(e - tau, 0.0);
  });
}

void softmax_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                const TensorView& y) {
  backward_rows(dx, dy, y, [](std::vector<double>& g, const std::vector<double>& p) {
    double dot = 0;
    for (size_t i = 0; i < g.size(); ++i) dot += g[i] * p[i];
    for (size_t i = 0; i < g.size(); ++i) g[i] = p[i] * (g[i] - dot);
  });
}

void log_softmax_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                    const TensorView& y) {
  backward_rows(dx, dy, y, [](std::vector<double>& g, const std::vector<double>& lp) {
    double sum = 0;
    for (double e : g) sum += e;
    for (size_t i = 0; i < g.size(); ++i) g[i] -= std::exp(lp[i]) * sum;
  });
}

void sparsemax_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                  const TensorView& y) {
  backward_rows(dx, dy, y, [](std::vector<double>& g, const std::vector<double>& p) {
    double sum = 0;
    int64_t k = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (p[i] > 0) {
        sum += g[i];
        ++k;
      }
    const double mean = k > 0 ? sum / double(k) : 0.0;
    for (size_t i = 0; i < g.size(); ++i) g[i] = p[i] > 0 ? g[i] - mean : 0.0;
  });
}

}  // namespace opforge
