// Reference kernels of the linear family: the oracle of the harness and every policy's last
// resort. Plain loops over named dimensions in double; each output is rounded once when stored.
// Matrices follow Note [row layout]; a row of w is widened to double once and used for every token.
#include <cmath>
#include <vector>

#include "ops/linear/internal.h"

namespace opforge {

namespace {

double at(const TensorView& t, int64_t row, int64_t i) {
  return load_as_double(t.data, t.dtype, row * t.row_stride() + i);
}
void put(const TensorView& t, int64_t row, int64_t i, double v) {
  store_from_double(t.data, t.dtype, row * t.row_stride() + i, v);
}

// All rows of a row-layout tensor as doubles, rows x cols, dense.
std::vector<double> to_double(const TensorView& t) {
  const int64_t rows = t.rows(), cols = t.size(-1);
  std::vector<double> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) v[size_t(r * cols + c)] = at(t, r, c);
  return v;
}

std::vector<double> row_of(const TensorView& t, int64_t row) {
  std::vector<double> v(size_t(t.size(-1)));
  for (int64_t c = 0; c < t.size(-1); ++c) v[size_t(c)] = at(t, row, c);
  return v;
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// logits[n * vocab + v] = hidden[n] . w[v] + b[v], in double.
std::vector<double> logits_of(const TensorView& hidden, const TensorView& w, const TensorView& b) {
  const int64_t tokens = hidden.size(0), h = hidden.size(1), vocab = w.size(0);
  const std::vector<double> x = to_double(hidden);
  std::vector<double> z(size_t(tokens * vocab));
  for (int64_t v = 0; v < vocab; ++v) {
    const std::vector<double> wv = row_of(w, v);
    const double bias = b.defined() ? at(b, 0, v) : 0.0;
    for (int64_t n = 0; n < tokens; ++n)
      z[size_t(n * vocab + v)] = dot(x.data() + (n * h), wv.data(), h) + bias;
  }
  return z;
}

double log_sum_exp(const double* z, int64_t n) {
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, z[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(z[i] - m);
  return m + std::log(s);
}

// Per-token weight of the loss in the reduction: 1 (none, sum) or 1 / counted tokens (mean).
double token_scale(Reduction r, int64_t counted) {
  if (r != Reduction::mean) return 1.0;
  return counted > 0 ? 1.0 / double(counted) : 0.0;
}

}  // namespace

void linear_reference(const Context&, const TensorView& y, const TensorView& x,
                      const TensorView& w, const TensorView& b) {
  const int64_t rows = x.rows(), in = x.size(-1), out = w.size(0);
  const std::vector<double> xd = to_double(x);
  for (int64_t m = 0; m < out; ++m) {
    const std::vector<double> wm = row_of(w, m);
    const double bias = b.defined() ? at(b, 0, m) : 0.0;
    for (int64_t n = 0; n < rows; ++n) put(y, n, m, dot(xd.data() + (n * in), wm.data(), in) + bias);
  }
}

void linear_backward_reference(const Context&, const TensorView& dx, const TensorView& dw,
                               const TensorView& db, const TensorView& dy, const TensorView& x,
                               const TensorView& w) {
  const int64_t rows = x.rows(), in = x.size(-1), out = w.size(0);
  const std::vector<double> xd = to_double(x), dyd = to_double(dy);
  std::vector<double> dxd(size_t(rows * in), 0.0), dwm(static_cast<size_t>(in));
  for (int64_t m = 0; m < out; ++m) {
    const std::vector<double> wm = row_of(w, m);
    double dbm = 0;
    std::fill(dwm.begin(), dwm.end(), 0.0);
    for (int64_t n = 0; n < rows; ++n) {
      const double g = dyd[size_t(n * out + m)];
      dbm += g;
      for (int64_t k = 0; k < in; ++k) {
        dxd[size_t(n * in + k)] += g * wm[size_t(k)];  // dx = dy @ w
        dwm[size_t(k)] += g * xd[size_t(n * in + k)];  // dw = dy^T @ x
      }
    }
    for (int64_t k = 0; k < in; ++k) put(dw, m, k, dwm[size_t(k)]);
    put(db, 0, m, dbm);
  }
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < in; ++k) put(dx, n, k, dxd[size_t(n * in + k)]);
}

// Note [flce semantics] (linear.h), with every logit materialised: this is the oracle.
void fused_linear_cross_entropy_reference(const Context&, const TensorView& loss,
                                          const TensorView& lse, const TensorView& hidden,
                                          const TensorView& w, const TensorView& target,
                                          const TensorView& b, int64_t ignore_index,
                                          double label_smoothing, std::string_view reduction) {
  const Reduction r = parse_reduction(FusedLinearCrossEntropy::name, reduction);
  const int64_t tokens = hidden.size(0), vocab = w.size(0);
  const std::vector<double> z = logits_of(hidden, w, b);
  const double ls = label_smoothing;
  double total = 0;
  for (int64_t n = 0; n < tokens; ++n) {
    const int64_t t = target_at(target, n);
    const double* zn = z.data() + (n * vocab);
    const double lse_n = log_sum_exp(zn, vocab);
    put(lse, 0, n, lse_n);
    double loss_n = 0;
    if (t != ignore_index) {
      double mean_z = 0;
      for (int64_t v = 0; v < vocab; ++v) mean_z += zn[v];
      mean_z /= double(vocab);
      loss_n = (1 - ls) * (lse_n - zn[t]) + ls * (lse_n - mean_z);
    }
    if (r == Reduction::none) put(loss, 0, n, loss_n);
    total += loss_n;
  }
  if (r != Reduction::none)
    store_from_double(loss.data, loss.dtype, 0, total * token_scale(r, count_targets(target, ignore_index)));
}

void fused_linear_cross_entropy_backward_reference(
    const Context&, const TensorView& dhidden, const TensorView& dw, const TensorView& db,
    const TensorView& dloss, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& lse, const TensorView& b, int64_t ignore_index,
    double label_smoothing, std::string_view reduction) {
  const Reduction r = parse_reduction(FusedLinearCrossEntropyBackward::name, reduction);
  const int64_t tokens = hidden.size(0), h = hidden.size(1), vocab = w.size(0);
  std::vector<double> g = logits_of(hidden, w, b);  // becomes G = dL/dlogits in place
  const double scale = token_scale(r, count_targets(target, ignore_index));
  const double ls = label_smoothing;
  for (int64_t n = 0; n < tokens; ++n) {
    double* gn = g.data() + (n * vocab);
    const int64_t t = target_at(target, n);
    const double upstream =
        r == Reduction::none ? load_as_double(dloss.data, dloss.dtype, n * dloss.stride(0))
                             : load_as_double(dloss.data, dloss.dtype, 0) * scale;
    if (t == ignore_index) {
      std::fill(gn, gn + vocab, 0.0);
      continue;
    }
    const double lse_n = load_as_double(lse.data, lse.dtype, n * lse.stride(0));  // the forward's
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = std::exp(gn[v] - lse_n);
      gn[v] = upstream * (p - (v == t ? 1 - ls : 0.0) - ls / double(vocab));
    }
  }
  const std::vector<double> x = to_double(hidden);
  std::vector<double> dx(size_t(tokens * h), 0.0), dwv(static_cast<size_t>(h));
  for (int64_t v = 0; v < vocab; ++v) {
    const std::vector<double> wv = row_of(w, v);
    std::fill(dwv.begin(), dwv.end(), 0.0);
    double dbv = 0;
    for (int64_t n = 0; n < tokens; ++n) {
      const double gnv = g[size_t(n * vocab + v)];
      dbv += gnv;
      for (int64_t k = 0; k < h; ++k) {
        dx[size_t(n * h + k)] += gnv * wv[size_t(k)];
        dwv[size_t(k)] += gnv * x[size_t(n * h + k)];
      }
    }
    for (int64_t k = 0; k < h; ++k) put(dw, v, k, dwv[size_t(k)]);
    put(db, 0, v, dbv);
  }
  for (int64_t n = 0; n < tokens; ++n)
    for (int64_t k = 0; k < h; ++k) put(dhidden, n, k, dx[size_t(n * h + k)]);
}

// The two ops' references in turn: the backward reads the lse the forward has just written.
void fused_linear_cross_entropy_with_grad_reference(
    const Context& ctx, const TensorView& loss, const TensorView& lse, const TensorView& dhidden,
    const TensorView& dw, const TensorView& db, const TensorView& hidden, const TensorView& w,
    const TensorView& target, const TensorView& dloss, const TensorView& b, int64_t ignore_index,
    double label_smoothing, std::string_view reduction) {
  fused_linear_cross_entropy_reference(ctx, loss, lse, hidden, w, target, b, ignore_index,
                                       label_smoothing, reduction);
  fused_linear_cross_entropy_backward_reference(ctx, dhidden, dw, db, dloss, hidden, w, target,
                                                lse, b, ignore_index, label_smoothing, reduction);
}

}  // namespace opforge
