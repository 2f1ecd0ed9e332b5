// Reference kernels of the layernorm family: the oracle of the harness and every policy's last
// resort. Plain loops; each element goes through load_as_double, sums are in double, and each
// output is rounded once when stored (store_from_double). layer_norm and dyt rows follow
// Note [row layout]; group_norm tensors are contiguous (its check says so).
#include <cmath>
#include <vector>

#include "ops/layernorm/layernorm.h"

namespace opforge {

namespace {

// Element `i` of row `row` of a row-layout tensor (a 1-D parameter vector is row 0).
double at(const TensorView& t, int64_t row, int64_t i) {
  return load_as_double(t.data, t.dtype, row * t.row_stride() + i);
}
void put(const TensorView& t, int64_t row, int64_t i, double v) {
  store_from_double(t.data, t.dtype, row * t.row_stride() + i, v);
}

struct Moments {
  double mean = 0, rstd = 0;
};

// Mean and 1 / sqrt(biased variance + eps) of `v`, the variance centred (two passes).
Moments moments_of(const std::vector<double>& v, double eps) {
  const double n = double(v.size());
  double sum = 0;
  for (double e : v) sum += e;
  const double mean = sum / n;
  double sum_sq = 0;
  for (double e : v) sum_sq += (e - mean) * (e - mean);
  return {mean, 1.0 / std::sqrt(sum_sq / n + eps)};
}

// dx of one normalised vector (layer_norm's row, group_norm's group): with xhat = (v - mean) *
// rstd and g the gradient of xhat, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
void normalize_backward(const std::vector<double>& v, const std::vector<double>& g,
                        const Moments& m, std::vector<double>& dx) {
  const double n = double(v.size());
  double sum_g = 0, sum_gx = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    sum_g += g[i];
    sum_gx += g[i] * (v[i] - m.mean) * m.rstd;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const double xhat = (v[i] - m.mean) * m.rstd;
    dx[i] = m.rstd * (g[i] - sum_g / n - xhat * sum_gx / n);
  }
}

}  // namespace

void layer_norm_reference(const Context&, const TensorView& y, const TensorView& x,
                          const TensorView& w, const TensorView& b, double eps) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  std::vector<double> v(static_cast<size_t>(hidden));
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < hidden; ++i) v[i] = at(x, row, i);  // the whole row first: y may be x
    const Moments m = moments_of(v, eps);
    for (int64_t i = 0; i < hidden; ++i) {
      const double bias = b.defined() ? at(b, 0, i) : 0.0;
      put(y, row, i, (v[i] - m.mean) * m.rstd * at(w, 0, i) + bias);
    }
  }
}

void layer_norm_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                                   const TensorView& db, const TensorView& dy, const TensorView& x,
                                   const TensorView& w, double eps) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  const size_t n = static_cast<size_t>(hidden);
  std::vector<double> v(n), g(n), dx_row(n), dw_sum(n, 0.0), db_sum(n, 0.0);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < hidden; ++i) {
      v[i] = at(x, row, i);
      g[i] = at(dy, row, i) * at(w, 0, i);
    }
    const Moments m = moments_of(v, eps);
    normalize_backward(v, g, m, dx_row);
    for (int64_t i = 0; i < hidden; ++i) {
      put(dx, row, i, dx_row[i]);
      dw_sum[i] += at(dy, row, i) * (v[i] - m.mean) * m.rstd;
      db_sum[i] += at(dy, row, i);
    }
  }
  for (int64_t i = 0; i < hidden; ++i) {
    put(dw, 0, i, dw_sum[i]);
    put(db, 0, i, db_sum[i]);
  }
}

// group_norm: x is [batch, channels, spatial...] contiguous; element (n, c, s) sits at
// (n * channels + c) * spatial + s.
void group_norm_reference(const Context&, const TensorView& y, const TensorView& x,
                          const TensorView& w, const TensorView& b, int64_t num_groups,
                          double eps) {
  const int64_t batch = x.size(0), channels = x.size(1);
  const int64_t spatial = channels > 0 && batch > 0 ? x.numel() / (batch * channels) : 0;
  const int64_t per_group = channels / num_groups;
  std::vector<double> v(static_cast<size_t>(per_group * spatial));
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t g = 0; g < num_groups; ++g) {
      const int64_t first = (n * channels + g * per_group) * spatial;  // the group is contiguous
      for (size_t e = 0; e < v.size(); ++e) v[e] = load_as_double(x.data, x.dtype, first + int64_t(e));
      const Moments m = moments_of(v, eps);
      for (int64_t c = 0; c < per_group; ++c)
        for (int64_t s = 0; s < spatial; ++s) {
          const int64_t channel = g * per_group + c, e = c * spatial + s;
          const double out = (v[e] - m.mean) * m.rstd * at(w, 0, channel) + at(b, 0, channel);
          store_from_double(y.data, y.dtype, first + e, out);
        }
    }
}

void group_norm_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                                   const TensorView& db, const TensorView& dy, const TensorView& x,
                                   const TensorView& w, int64_t num_groups, double eps) {
  const int64_t batch = x.size(0), channels = x.size(1);
  const int64_t spatial = channels > 0 && batch > 0 ? x.numel() / (batch * channels) : 0;
  const int64_t per_group = channels / num_groups;
  const size_t len = static_cast<size_t>(per_group * spatial);
  std::vector<double> v(len), g(len), d(len), dw_sum(size_t(channels), 0.0), db_sum(size_t(channels), 0.0);
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t grp = 0; grp < num_groups; ++grp) {
      const int64_t first = (n * channels + grp * per_group) * spatial;
      for (int64_t c = 0; c < per_group; ++c)
        for (int64_t s = 0; s < spatial; ++s) {
          const int64_t e = c * spatial + s;
          v[e] = load_as_double(x.data, x.dtype, first + e);
          g[e] = load_as_double(dy.data, dy.dtype, first + e) * at(w, 0, grp * per_group + c);
        }
      const Moments m = moments_of(v, eps);
      normalize_backward(v, g, m, d);
      for (int64_t c = 0; c < per_group; ++c)
        for (int64_t s = 0; s < spatial; ++s) {
          const int64_t e = c * spatial + s, channel = grp * per_group + c;
          const double upstream = load_as_double(dy.data, dy.dtype, first + e);
          store_from_double(dx.data, dx.dtype, first + e, d[e]);
          dw_sum[channel] += upstream * (v[e] - m.mean) * m.rstd;
          db_sum[channel] += upstream;
        }
    }
  for (int64_t c = 0; c < channels; ++c) {
    put(dw, 0, c, dw_sum[c]);
    put(db, 0, c, db_sum[c]);
  }
}

void dyt_reference(const Context&, const TensorView& y, const TensorView& x,
                   const TensorView& alpha, const TensorView& gamma, const TensorView& beta) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  const double a = at(alpha, 0, 0);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < hidden; ++i) {
      const double shift = beta.defined() ? at(beta, 0, i) : 0.0;
      put(y, row, i, at(gamma, 0, i) * std::tanh(a * at(x, row, i)) + shift);
    }
}

void dyt_backward_reference(const Context&, const TensorView& dx, const TensorView& dalpha,
                            const TensorView& dgamma, const TensorView& dbeta,
                            const TensorView& dy, const TensorView& x, const TensorView& alpha,
                            const TensorView& gamma) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  const double a = at(alpha, 0, 0);
  std::vector<double> dgamma_sum(size_t(hidden), 0.0), dbeta_sum(size_t(hidden), 0.0);
  double dalpha_sum = 0;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < hidden; ++i) {
      const double v = at(x, row, i), g = at(dy, row, i), gm = at(gamma, 0, i);
      const double t = std::tanh(a * v);
      const double dtanh = gm * (1 - t * t) * g;  // gradient of alpha * x
      put(dx, row, i, a * dtanh);
      dalpha_sum += v * dtanh;
      dgamma_sum[i] += g * t;
      dbeta_sum[i] += g;
    }
  put(dalpha, 0, 0, dalpha_sum);
  for (int64_t i = 0; i < hidden; ++i) {
    put(dgamma, 0, i, dgamma_sum[i]);
    put(dbeta, 0, i, dbeta_sum[i]);
  }
}

}  // namespace opforge
