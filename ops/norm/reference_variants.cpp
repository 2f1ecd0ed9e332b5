// Reference kernels of rms_norm_gated and poly_norm (and their backward ops): plain loops, double
// accumulation, one rounding per output. Rows follow Note [row layout].
#include <cmath>
#include <vector>

#include "ops/norm/internal.h"

namespace opforge {

namespace {

double at(const TensorView& t, int64_t row, int64_t i) {
  return load_as_double(t.data, t.dtype, row * t.row_stride() + i);
}
void put(const TensorView& t, int64_t row, int64_t i, double v) {
  store_from_double(t.data, t.dtype, row * t.row_stride() + i, v);
}

size_t n_of(int64_t n) { return static_cast<size_t>(n); }

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// The gate act(z) and its derivative act'(z).
struct Gate {
  double value, slope;
};
Gate gate(GateActivation act, double z) {
  const double s = sigmoid(z);
  if (act == GateActivation::sigmoid) return {s, s * (1.0 - s)};
  return {z * s, s * (1.0 + z * (1.0 - s))};  // silu
}

GateActivation activation_of(std::string_view name) {
  GateActivation act = GateActivation::silu;
  parse_gate_activation(name, act);  // the op's check accepted it
  return act;
}

double rstd_of(const double* v, int64_t n, double eps) {
  double sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) sum_sq += v[i] * v[i];
  return 1.0 / std::sqrt(sum_sq / double(n) + eps);
}

}  // namespace

bool parse_gate_activation(std::string_view name, GateActivation& out) {
  if (name == "silu" || name == "swish") out = GateActivation::silu;
  else if (name == "sigmoid") out = GateActivation::sigmoid;
  else return false;
  return true;
}

void rms_norm_gated_reference(const Context&, const TensorView& y, const TensorView& x,
                              const TensorView& z, const TensorView& w, double eps,
                              int64_t group_size, bool norm_before_gate,
                              std::string_view activation) {
  const GateActivation act = activation_of(activation);
  const int64_t rows = x.rows(), hidden = x.size(-1), group = gate_group(hidden, group_size);
  std::vector<double> u(n_of(hidden)), g(n_of(hidden));
  for (int64_t row = 0; row < rows; ++row) {
    // Read the whole row before writing: y may alias x.
    for (int64_t i = 0; i < hidden; ++i) {
      g[i] = gate(act, at(z, row, i)).value;
      u[i] = norm_before_gate ? at(x, row, i) : at(x, row, i) * g[i];
    }
    for (int64_t start = 0; start < hidden; start += group) {
      const double rstd = rstd_of(u.data() + start, group, eps);
      for (int64_t i = start; i < start + group; ++i) {
        const double normed = u[i] * rstd * at(w, 0, i);
        put(y, row, i, norm_before_gate ? normed * g[i] : normed);
      }
    }
  }
}

void rms_norm_gated_backward_reference(const Context&, const TensorView& dx, const TensorView& dz,
                                       const TensorView& dw, const TensorView& dy,
                                       const TensorView& x, const TensorView& z,
                                       const TensorView& w, double eps, int64_t group_size,
                                       bool norm_before_gate, std::string_view activation) {
  const GateActivation act = activation_of(activation);
  const int64_t rows = x.rows(), hidden = x.size(-1), group = gate_group(hidden, group_size);
  const size_t n = size_t(hidden);
  std::vector<double> xs(n), u(n), m(n), dw_sum(n, 0.0);
  std::vector<Gate> gates(n);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < hidden; ++i) {
      xs[i] = at(x, row, i);
      gates[i] = gate(act, at(z, row, i));
      u[i] = norm_before_gate ? xs[i] : xs[i] * gates[i].value;  // what is normalised
    }
    for (int64_t start = 0; start < hidden; start += group) {
      const double rstd = rstd_of(u.data() + start, group, eps);
      double sum_mu = 0;
      for (int64_t i = start; i < start + group; ++i) {
        const double d = at(dy, row, i);
        // Upstream gradient of the normalised value u * rstd * w.
        const double dn = norm_before_gate ? d * gates[i].value : d;
        m[i] = dn * at(w, 0, i);
        sum_mu += m[i] * u[i];
        dw_sum[i] += dn * u[i] * rstd;
      }
      const double coef = rstd * rstd * rstd / double(group) * sum_mu;
      for (int64_t i = start; i < start + group; ++i) {
        const double du = rstd * m[i] - coef * u[i];
        const double d = at(dy, row, i);
        if (norm_before_gate) {
          put(dx, row, i, du);
          put(dz, row, i, d * u[i] * rstd * at(w, 0, i) * gates[i].slope);
        } else {
          put(dx, row, i, du * gates[i].value);
          put(dz, row, i, du * xs[i] * gates[i].slope);
        }
      }
    }
  }
  for (int64_t i = 0; i < hidden; ++i) put(dw, 0, i, dw_sum[i]);
}

// PolyNorm: powers p = 3, 2, 1 pair with w[0], w[1], w[2].
void poly_norm_reference(const Context&, const TensorView& y, const TensorView& x,
                         const TensorView& w, const TensorView& b, double eps) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  const double w3 = at(w, 0, 0), w2 = at(w, 0, 1), w1 = at(w, 0, 2), bias = at(b, 0, 0);
  std::vector<double> v(n_of(hidden));
  for (int64_t row = 0; row < rows; ++row) {
    double s2 = 0, s4 = 0, s6 = 0;  // sums of x^2, x^4, x^6
    for (int64_t i = 0; i < hidden; ++i) {
      v[i] = at(x, row, i);
      const double sq = v[i] * v[i];
      s2 += sq;
      s4 += sq * sq;
      s6 += sq * sq * sq;
    }
    const double r1 = 1.0 / std::sqrt(s2 / double(hidden) + eps);
    const double r2 = 1.0 / std::sqrt(s4 / double(hidden) + eps);
    const double r3 = 1.0 / std::sqrt(s6 / double(hidden) + eps);
    for (int64_t i = 0; i < hidden; ++i) {
      const double e = v[i];
      put(y, row, i, w3 * e * e * e * r3 + w2 * e * e * r2 + w1 * e * r1 + bias);
    }
  }
}

void poly_norm_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                                  const TensorView& db, const TensorView& dy, const TensorView& x,
                                  const TensorView& w, double eps) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  const double n = double(hidden);
  const double wp[4] = {0, at(w, 0, 2), at(w, 0, 1), at(w, 0, 0)};  // wp[p]
  double dw_sum[4] = {0, 0, 0, 0}, db_sum = 0;
  std::vector<double> v(n_of(hidden)), g(n_of(hidden));
  for (int64_t row = 0; row < rows; ++row) {
    double sq_sum[4] = {0, 0, 0, 0}, s[4] = {0, 0, 0, 0};  // sum x^(2p), S_p = sum dy * x^p
    for (int64_t i = 0; i < hidden; ++i) {
      v[i] = at(x, row, i);
      g[i] = at(dy, row, i);
      db_sum += g[i];
      for (int p = 1; p <= 3; ++p) {
        const double xp = std::pow(v[i], p);
        sq_sum[p] += xp * xp;
        s[p] += g[i] * xp;
      }
    }
    double r[4] = {0, 0, 0, 0};
    for (int p = 1; p <= 3; ++p) {
      r[p] = 1.0 / std::sqrt(sq_sum[p] / n + eps);
      dw_sum[p] += r[p] * s[p];
    }
    for (int64_t i = 0; i < hidden; ++i) {
      double d = 0;
      for (int p = 1; p <= 3; ++p)
        d += wp[p] * (p * std::pow(v[i], p - 1) * g[i] * r[p] -
                      (p / n) * std::pow(v[i], 2 * p - 1) * r[p] * r[p] * r[p] * s[p]);
      put(dx, row, i, d);
    }
  }
  put(dw, 0, 0, dw_sum[3]);
  put(dw, 0, 1, dw_sum[2]);
  put(dw, 0, 2, dw_sum[1]);
  put(db, 0, 0, db_sum);
}

}  // namespace opforge
