// Reference kernels of the loss family: plain loops in double over [N, V] rows, one rounding per
// output. The oracle of the harness and the last resort of every policy.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/loss/internal.h"

namespace opforge {

namespace {

double at(const TensorView& t, int64_t row, int64_t i) {
  return load_as_double(t.data, t.dtype, row * (t.ndim > 1 ? t.row_stride() : t.stride(0)) + i);
}
void put(const TensorView& t, int64_t row, int64_t i, double v) {
  store_from_double(t.data, t.dtype, row * (t.ndim > 1 ? t.row_stride() : t.stride(0)) + i, v);
}
int64_t id_at(const TensorView& ids, int64_t row) { return ids.ptr<const int64_t>()[row * ids.stride(0)]; }

// z = softcap * tanh(x / softcap), or x when softcap is 0.
double capped(double x, double softcap) { return softcap > 0 ? softcap * std::tanh(x / softcap) : x; }

// Row `row` of logits after the softcap.
std::vector<double> z_row(const TensorView& logits, int64_t row, double softcap) {
  std::vector<double> z(size_t(logits.size(1)));
  for (size_t j = 0; j < z.size(); ++j) z[j] = capped(at(logits, row, int64_t(j)), softcap);
  return z;
}

double log_sum_exp(const std::vector<double>& z) {
  double m = -INFINITY;
  for (double v : z) m = std::max(m, v);
  if (std::isinf(m)) return m;
  double s = 0;
  for (double v : z) s += std::exp(v - m);
  return m + std::log(s);
}

// Upstream gradient of row `row` (per-row losses) or of the reduced loss, divided by `divisor`.
double upstream(const TensorView& dloss, Reduction r, int64_t row, double divisor) {
  return r == Reduction::none ? at(dloss, 0, row) : at(dloss, 0, 0) / divisor;
}

}  // namespace

void cross_entropy_reference(const Context&, const TensorView& loss, const TensorView& lse,
                             const TensorView& logits, const TensorView& target,
                             int64_t ignore_index, double label_smoothing, double lse_square_scale,
                             double softcap, std::string_view reduction) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const Reduction r = reduction_of(reduction);
  const double eps = label_smoothing / double(vocab);
  double total = 0;
  int64_t kept = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const std::vector<double> z = z_row(logits, row, softcap);
    const double l = log_sum_exp(z);
    put(lse, 0, row, l);
    const int64_t t = id_at(target, row);
    double row_loss = 0;
    if (t != ignore_index) {
      row_loss = (1 - label_smoothing) * (l - z[size_t(t)]) + lse_square_scale * l * l;
      if (label_smoothing > 0) {  // (masked -inf logits would give 0 * -inf without the test)
        double sum_z = 0;
        for (double v : z) sum_z += v;
        row_loss += label_smoothing * l - eps * sum_z;
      }
      ++kept;
    }
    if (r == Reduction::none) put(loss, 0, row, row_loss);
    total += row_loss;
  }
  if (r == Reduction::sum) put(loss, 0, 0, total);
  if (r == Reduction::mean) put(loss, 0, 0, total / double(kept));  // 0 kept rows: NaN
}

void cross_entropy_backward_reference(const Context&, const TensorView& dlogits,
                                      const TensorView& dloss, const TensorView& logits,
                                      const TensorView& target, const TensorView& lse,
                                      int64_t ignore_index, double label_smoothing,
                                      double lse_square_scale, double softcap,
                                      std::string_view reduction) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const Reduction r = reduction_of(reduction);
  const double eps = label_smoothing / double(vocab);
  const double divisor = r == Reduction::mean ? double(kept_rows(target, rows, ignore_index)) : 1.0;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = id_at(target, row);
    if (t == ignore_index) {
      for (int64_t j = 0; j < vocab; ++j) put(dlogits, row, j, 0.0);
      continue;
    }
    const double g = upstream(dloss, r, row, divisor);
    const double l = at(lse, 0, row);
    const std::vector<double> z = z_row(logits, row, softcap);
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(z[size_t(j)] - l);
      double dz = (1 + 2 * lse_square_scale * l) * p - eps - (j == t ? 1 - label_smoothing : 0.0);
      if (softcap > 0) dz *= 1 - (z[size_t(j)] / softcap) * (z[size_t(j)] / softcap);
      put(dlogits, row, j, g * dz);
    }
  }
}

// cross_entropy then cross_entropy_backward from the lse just written: the fused op's definition.
void cross_entropy_with_grad_reference(const Context& ctx, const TensorView& loss,
                                       const TensorView& lse, const TensorView& dlogits,
                                       const TensorView& logits, const TensorView& target,
                                       const TensorView& dloss, int64_t ignore_index,
                                       double label_smoothing, double lse_square_scale,
                                       double softcap, std::string_view reduction) {
  cross_entropy_reference(ctx, loss, lse, logits, target, ignore_index, label_smoothing,
                          lse_square_scale, softcap, reduction);
  cross_entropy_backward_reference(ctx, dlogits, dloss, logits, target, lse, ignore_index,
                                   label_smoothing, lse_square_scale, softcap, reduction);
}

void kl_div_reference(const Context&, const TensorView& loss, const TensorView& y_pred,
                      const TensorView& y_true, bool log_target, std::string_view reduction,
                      double eps) {
  const int64_t rows = y_pred.size(0), vocab = y_pred.size(1);
  const Reduction r = reduction_of(reduction);
  double total = 0;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = at(y_pred, row, j), t = at(y_true, row, j);
      const double l = log_target ? std::exp(t) * (t - p) : t * (std::log(std::max(t, eps)) - p);
      if (r == Reduction::none) put(loss, row, j, l);
      total += l;
    }
  if (r != Reduction::none) put(loss, 0, 0, total / reduction_divisor(r, rows, vocab));
}

void kl_div_backward_reference(const Context&, const TensorView& dy_pred, const TensorView& dloss,
                               const TensorView& y_true, bool log_target,
                               std::string_view reduction, double) {
  const int64_t rows = y_true.size(0), vocab = y_true.size(1);
  const Reduction r = reduction_of(reduction);
  const double divisor = reduction_divisor(r, rows, vocab);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t j = 0; j < vocab; ++j) {
      const double t = at(y_true, row, j);
      const double g = r == Reduction::none ? at(dloss, row, j) : at(dloss, 0, 0) / divisor;
      put(dy_pred, row, j, -(log_target ? std::exp(t) : t) * g);
    }
}

namespace {

// Element loss of jsd and its derivative by x, for x = log Q, y = log P.
struct JsdTerm {
  double loss, grad;
};
JsdTerm jsd_term(double x, double y, double beta) {
  const double q = std::exp(x), p = std::exp(y);
  if (beta == 0) return {p * (y - x), -p};
  if (beta == 1) return {q * (x - y), q * (x - y) + q};
  const double m = beta * p + (1 - beta) * q, log_m = std::log(m);
  return {beta * p * y + (1 - beta) * q * x - m * log_m, (1 - beta) * q * (x - log_m)};
}

}  // namespace

void jsd_reference(const Context&, const TensorView& loss, const TensorView& input,
                   const TensorView& target, const TensorView& labels, double beta,
                   int64_t ignore_index) {
  const int64_t rows = input.size(0), vocab = input.size(1);
  double total = 0;
  for (int64_t row = 0; row < rows; ++row) {
    if (!row_kept(labels, row, ignore_index)) continue;
    for (int64_t j = 0; j < vocab; ++j) total += jsd_term(at(input, row, j), at(target, row, j), beta).loss;
  }
  put(loss, 0, 0, total / double(kept_rows(labels, rows, ignore_index)));
}

void jsd_backward_reference(const Context&, const TensorView& dinput, const TensorView& dloss,
                            const TensorView& input, const TensorView& target,
                            const TensorView& labels, double beta, int64_t ignore_index) {
  const int64_t rows = input.size(0), vocab = input.size(1);
  const double g = at(dloss, 0, 0) / double(kept_rows(labels, rows, ignore_index));
  for (int64_t row = 0; row < rows; ++row) {
    const bool kept = row_kept(labels, row, ignore_index);
    for (int64_t j = 0; j < vocab; ++j)
      put(dinput, row, j, kept ? g * jsd_term(at(input, row, j), at(target, row, j), beta).grad : 0.0);
  }
}

void tvd_reference(const Context&, const TensorView& loss, const TensorView& p,
                   const TensorView& q, const TensorView& labels, std::string_view reduction,
                   int64_t ignore_index) {
  const int64_t rows = p.size(0), vocab = p.size(1);
  const Reduction r = reduction_of(reduction);
  double total = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const bool kept = row_kept(labels, row, ignore_index);
    for (int64_t j = 0; j < vocab; ++j) {
      const double l = kept ? 0.5 * std::fabs(at(p, row, j) - at(q, row, j)) : 0.0;
      if (r == Reduction::none) put(loss, row, j, l);
      total += l;
    }
  }
  if (r != Reduction::none)
    put(loss, 0, 0, total / reduction_divisor(r, kept_rows(labels, rows, ignore_index), vocab));
}

void tvd_backward_reference(const Context&, const TensorView& dp, const TensorView& dloss,
                            const TensorView& p, const TensorView& q, const TensorView& labels,
                            std::string_view reduction, int64_t ignore_index) {
  const int64_t rows = p.size(0), vocab = p.size(1);
  const Reduction r = reduction_of(reduction);
  const double divisor = reduction_divisor(r, kept_rows(labels, rows, ignore_index), vocab);
  for (int64_t row = 0; row < rows; ++row) {
    const bool kept = row_kept(labels, row, ignore_index);
    for (int64_t j = 0; j < vocab; ++j) {
      const double g = r == Reduction::none ? at(dloss, row, j) : at(dloss, 0, 0) / divisor;
      const double sign = at(p, row, j) > at(q, row, j) ? 0.5 : -0.5;
      put(dp, row, j, kept ? g * sign : 0.0);
    }
  }
}

}  // namespace opforge
