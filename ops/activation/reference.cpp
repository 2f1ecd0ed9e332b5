// Reference kernels of the activation family: plain loops over rows and columns, double
// arithmetic, one rounding per output. Rows follow Note [row layout] (ops/norm/norm.h).
//
// Each activation is a pair of plain functions (value, derivative); two loops serve all of them:
// gated() for x [..., 2d] -> y [..., d] and pointwise() for y = f(x).
#include <algorithm>
#include <cmath>

#include "ops/activation/activation.h"

namespace opforge {

namespace {

double at(const TV& t, int64_t row, int64_t i) {
  return load_as_double(t.data, t.dtype, row * t.row_stride() + i);
}
void put(const TV& t, int64_t row, int64_t i, double v) {
  store_from_double(t.data, t.dtype, row * t.row_stride() + i, v);
}

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluFastC = 0.7978845608;              // FastGELU's literal
constexpr double kQuickGeluAlpha = 1.702;

double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

// An activation and its derivative at a.
struct Act {
  double value;
  double slope;
};

// a sigmoid(alpha a): silu (alpha 1), quick_gelu.
Act scaled_silu(double a, double alpha) {
  const double s = sigmoid(alpha * a);
  return {a * s, s * (1.0 + alpha * a * (1.0 - s))};
}

// 0.5 a (1 + tanh(c (a + 0.044715 a^3)))
Act gelu_tanh(double a, double c) {
  const double t = std::tanh(c * (a + 0.044715 * a * a * a));
  const double dt = (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * a * a);
  return {0.5 * a * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * a * dt};
}

// a Phi(a), Phi the standard normal CDF; Phi from erfc so that the left tail stays accurate.
Act gelu_erf(double a) {
  const double cdf = 0.5 * std::erfc(-a / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * a * a) / std::sqrt(2.0 * M_PI);
  return {a * cdf, cdf + a * pdf};
}

Act fatrelu(double a, double threshold) { return a > threshold ? Act{a, 1.0} : Act{0.0, 0.0}; }

Act relu2(double a) {
  const double r = std::max(a, 0.0);
  return {r * r, 2.0 * r};
}

struct XieluParams {
  double alpha_p, alpha_n, beta, eps;
};
Act xielu(double a, const XieluParams& p) {
  if (a > 0) return {p.alpha_p * a * a + p.beta * a, 2.0 * p.alpha_p * a + p.beta};
  const double value = (std::expm1(std::min(a, p.eps)) - a) * p.alpha_n + p.beta * a;
  // d expm1(min(a, eps)) / da is e^a below eps and 0 above it.
  const double slope = p.alpha_n * ((a < p.eps ? std::exp(a) : 0.0) - 1.0) + p.beta;
  return {value, slope};
}

// ---- gated loops ------------------------------------------------------------------------------
// Column i of a row: gate at gate_col(i), up value at up_col(i).
struct GatedLayout {
  int64_t d;
  bool interleaved;
  bool gate_second;  // mul_and_silu: the activation is on the second half
  int64_t gate_col(int64_t i) const { return interleaved ? 2 * i : gate_second ? d + i : i; }
  int64_t up_col(int64_t i) const { return interleaved ? 2 * i + 1 : gate_second ? i : d + i; }
};

// An up-value transform and its derivative (swigluoai_and_mul's clamp(b) + 1; else b itself).
struct Up {
  double value;
  double slope;
};
Up identity_up(double b) { return {b, 1.0}; }

// y[i] = act(gate) * up(b)
template <class ActFn, class UpFn>
void gated(const TV& y, const TV& x, GatedLayout layout, ActFn act, UpFn up) {
  const int64_t rows = x.rows();
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < layout.d; ++i) {
      const double a = at(x, row, layout.gate_col(i)), b = at(x, row, layout.up_col(i));
      put(y, row, i, act(a).value * up(b).value);
    }
  }
}

// dgate = dy * up(b) * act'(a), dup = dy * act(a) * up'(b), stored where x holds gate and up.
template <class ActFn, class UpFn>
void gated_backward(const TV& dx, const TV& dy, const TV& x, GatedLayout layout, ActFn act,
                    UpFn up) {
  const int64_t rows = x.rows();
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < layout.d; ++i) {
      const double a = at(x, row, layout.gate_col(i)), b = at(x, row, layout.up_col(i));
      const double g = at(dy, row, i);
      const Act fa = act(a);
      const Up ub = up(b);
      put(dx, row, layout.gate_col(i), g * ub.value * fa.slope);
      put(dx, row, layout.up_col(i), g * fa.value * ub.slope);
    }
  }
}

GatedLayout halves(const TV& x, bool gate_second = false) {
  return {x.size(-1) / 2, false, gate_second};
}

// ---- pointwise loops ---------------------------------------------------------------------------
template <class ActFn> void pointwise(const TV& y, const TV& x, ActFn act) {
  const int64_t rows = x.rows(), n = x.size(-1);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < n; ++i) put(y, row, i, act(at(x, row, i)).value);
}

// dx may be dy itself (in place): each element is read before it is written.
template <class ActFn> void pointwise_backward(const TV& dx, const TV& dy, const TV& x, ActFn act) {
  const int64_t rows = x.rows(), n = x.size(-1);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < n; ++i) put(dx, row, i, at(dy, row, i) * act(at(x, row, i)).slope);
}

auto silu_fn = [](double a) { return scaled_silu(a, 1.0); };

auto gelu_fn(std::string_view approximate) {
  const bool tanh_form = approximate == "tanh";
  return [tanh_form](double a) { return tanh_form ? gelu_tanh(a, kSqrt2OverPi) : gelu_erf(a); };
}

// swigluoai_and_mul: g = min(a, limit), act = g sigmoid(alpha g); up = clamp(b) + 1.
auto oai_gate(double alpha, double limit) {
  return [=](double a) {
    const Act f = scaled_silu(std::min(a, limit), alpha);
    return Act{f.value, a <= limit ? f.slope : 0.0};
  };
}
auto oai_up(double limit) {
  return [=](double b) {
    return Up{std::clamp(b, -limit, limit) + 1.0, (b >= -limit && b <= limit) ? 1.0 : 0.0};
  };
}

}  // namespace

void silu_and_mul_reference(const Context&, const TV& y, const TV& x) {
  gated(y, x, halves(x), silu_fn, identity_up);
}
void silu_and_mul_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x) {
  gated_backward(dx, dy, x, halves(x), silu_fn, identity_up);
}
void mul_and_silu_reference(const Context&, const TV& y, const TV& x) {
  gated(y, x, halves(x, true), silu_fn, identity_up);
}
void mul_and_silu_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x) {
  gated_backward(dx, dy, x, halves(x, true), silu_fn, identity_up);
}
void gelu_and_mul_reference(const Context&, const TV& y, const TV& x,
                            std::string_view approximate) {
  gated(y, x, halves(x), gelu_fn(approximate), identity_up);
}
void gelu_and_mul_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x,
                                     std::string_view approximate) {
  gated_backward(dx, dy, x, halves(x), gelu_fn(approximate), identity_up);
}
void fatrelu_and_mul_reference(const Context&, const TV& y, const TV& x, double threshold) {
  gated(y, x, halves(x), [=](double a) { return fatrelu(a, threshold); }, identity_up);
}
void fatrelu_and_mul_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x,
                                        double threshold) {
  gated_backward(dx, dy, x, halves(x), [=](double a) { return fatrelu(a, threshold); },
                 identity_up);
}
void swigluoai_and_mul_reference(const Context&, const TV& y, const TV& x, double alpha,
                                 double limit) {
  gated(y, x, {x.size(-1) / 2, true, false}, oai_gate(alpha, limit), oai_up(limit));
}
void swigluoai_and_mul_backward_reference(const Context&, const TV& dx, const TV& dy,
                                          const TV& x, double alpha, double limit) {
  gated_backward(dx, dy, x, {x.size(-1) / 2, true, false}, oai_gate(alpha, limit), oai_up(limit));
}

void gelu_new_reference(const Context&, const TV& y, const TV& x) {
  pointwise(y, x, [](double a) { return gelu_tanh(a, kSqrt2OverPi); });
}
void gelu_new_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x) {
  pointwise_backward(dx, dy, x, [](double a) { return gelu_tanh(a, kSqrt2OverPi); });
}
void gelu_fast_reference(const Context&, const TV& y, const TV& x) {
  pointwise(y, x, [](double a) { return gelu_tanh(a, kGeluFastC); });
}
void gelu_fast_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x) {
  pointwise_backward(dx, dy, x, [](double a) { return gelu_tanh(a, kGeluFastC); });
}
void quick_gelu_reference(const Context&, const TV& y, const TV& x) {
  pointwise(y, x, [](double a) { return scaled_silu(a, kQuickGeluAlpha); });
}
void quick_gelu_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x) {
  pointwise_backward(dx, dy, x, [](double a) { return scaled_silu(a, kQuickGeluAlpha); });
}
void relu2_reference(const Context&, const TV& y, const TV& x) { pointwise(y, x, relu2); }
void relu2_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x) {
  pointwise_backward(dx, dy, x, relu2);
}
void xielu_reference(const Context&, const TV& y, const TV& x, double alpha_p, double alpha_n,
                     double beta, double eps) {
  const XieluParams p{alpha_p, alpha_n, beta, eps};
  pointwise(y, x, [&](double a) { return xielu(a, p); });
}
void xielu_backward_reference(const Context&, const TV& dx, const TV& dy, const TV& x,
                              double alpha_p, double alpha_n, double beta, double eps) {
  const XieluParams p{alpha_p, alpha_n, beta, eps};
  pointwise_backward(dx, dy, x, [&](double a) { return xielu(a, p); });
}

}  // namespace opforge
