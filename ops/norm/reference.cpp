// Reference kernels of the norm family: the oracle of the harness and every policy's last resort.
// Plain loops over rows and hidden; each element goes through load_as_double, sums are in double,
// and each output is rounded once when stored (store_from_double). Rows follow Note [row layout].
#include <cmath>
#include <vector>

#include "ops/norm/norm.h"

namespace opforge {

namespace {

// Element `i` of row `row` of a row-layout tensor.
double at(const TensorView& t, int64_t row, int64_t i) {
  return load_as_double(t.data, t.dtype, row * t.row_stride() + i);
}
void put(const TensorView& t, int64_t row, int64_t i, double v) {
  store_from_double(t.data, t.dtype, row * t.row_stride() + i, v);
}

// v rounded to `dtype` as a store and a load would (Note [rounding]).
double round_to_dtype(double v, DType dtype) {
  switch (dtype) {
    case DType::f32: return double(float(v));
    case DType::f16: return double(f16_to_f32(f32_to_f16(float(v))));
    case DType::bf16: return double(bf16_to_f32(f32_to_bf16(float(v))));
    default: return v;
  }
}

// rstd = 1 / sqrt(mean(v^2) + eps) of a row held in `v`.
double rstd_of(const std::vector<double>& v, double eps) {
  double sum_sq = 0;
  for (double e : v) sum_sq += e * e;
  return 1.0 / std::sqrt(sum_sq / double(v.size()) + eps);
}

// The rms_norm backward of one row: dx (into `dx`) for input row `v`, gradient row `dy`; adds
// dy * v * rstd into dw_sum.
void rms_norm_backward_row(const std::vector<double>& v, const std::vector<double>& dy,
                           const TensorView& w, double eps, double offset, std::vector<double>& dx,
                           std::vector<double>& dw_sum) {
  const int64_t hidden = int64_t(v.size());
  const double rstd = rstd_of(v, eps);
  double sum_mx = 0;  // sum over the row of m * x, m = dy * (w + offset)
  for (int64_t i = 0; i < hidden; ++i) sum_mx += dy[i] * (at(w, 0, i) + offset) * v[i];
  const double coef = rstd * rstd * rstd / double(hidden) * sum_mx;
  for (int64_t i = 0; i < hidden; ++i) {
    const double m = dy[i] * (at(w, 0, i) + offset);
    dx[i] = rstd * m - coef * v[i];
    dw_sum[i] += dy[i] * v[i] * rstd;
  }
}

}  // namespace

void rms_norm_reference(const Context&, const TensorView& y, const TensorView& x,
                        const TensorView& w, double eps, double offset) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  std::vector<double> v(static_cast<size_t>(hidden));
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < hidden; ++i) v[i] = at(x, row, i);
    const double rstd = rstd_of(v, eps);
    for (int64_t i = 0; i < hidden; ++i) put(y, row, i, v[i] * rstd * (at(w, 0, i) + offset));
  }
}

void fused_add_rms_norm_reference(const Context&, const TensorView& y, const TensorView& s,
                                  const TensorView& x, const TensorView& residual,
                                  const TensorView& w, double eps, double offset) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  std::vector<double> v(static_cast<size_t>(hidden));
  for (int64_t row = 0; row < rows; ++row) {
    // Read the whole row of x and residual before writing: y may alias x, s may alias residual.
    for (int64_t i = 0; i < hidden; ++i)
      v[i] = round_to_dtype(at(x, row, i) + at(residual, row, i), x.dtype);
    for (int64_t i = 0; i < hidden; ++i) put(s, row, i, v[i]);
    const double rstd = rstd_of(v, eps);
    for (int64_t i = 0; i < hidden; ++i) put(y, row, i, v[i] * rstd * (at(w, 0, i) + offset));
  }
}

void rms_norm_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                                 const TensorView& dy, const TensorView& x, const TensorView& w,
                                 double eps, double offset) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  const size_t n = static_cast<size_t>(hidden);
  std::vector<double> v(n), g(n), dx_row(n);
  std::vector<double> dw_sum(n, 0.0);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < hidden; ++i) {
      v[i] = at(x, row, i);
      g[i] = at(dy, row, i);
    }
    rms_norm_backward_row(v, g, w, eps, offset, dx_row, dw_sum);
    for (int64_t i = 0; i < hidden; ++i) put(dx, row, i, dx_row[i]);
  }
  for (int64_t i = 0; i < hidden; ++i) put(dw, 0, i, dw_sum[i]);
}

void fused_add_rms_norm_backward_reference(const Context&, const TensorView& dx,
                                           const TensorView& dresidual, const TensorView& dw,
                                           const TensorView& dy, const TensorView& ds,
                                           const TensorView& x, const TensorView& residual,
                                           const TensorView& w, double eps, double offset) {
  const int64_t rows = x.rows(), hidden = x.size(-1);
  const size_t n = static_cast<size_t>(hidden);
  std::vector<double> v(n), g(n), dx_row(n);
  std::vector<double> dw_sum(n, 0.0);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < hidden; ++i) {
      v[i] = round_to_dtype(at(x, row, i) + at(residual, row, i), x.dtype);  // s, as forward
      g[i] = at(dy, row, i);
    }
    rms_norm_backward_row(v, g, w, eps, offset, dx_row, dw_sum);
    for (int64_t i = 0; i < hidden; ++i) {
      const double d = dx_row[i] + at(ds, row, i);  // s feeds y and the next layer
      put(dx, row, i, d);
      put(dresidual, row, i, d);
    }
  }
  for (int64_t i = 0; i < hidden; ++i) put(dw, 0, i, dw_sum[i]);
}

}  // namespace opforge
