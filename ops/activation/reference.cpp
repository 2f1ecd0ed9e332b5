// Reference kernels of the activation family: plain loops over rows and the d gated columns,
// double arithmetic, one rounding per output. Rows follow Note [row layout] (ops/norm/norm.h).
#include <cmath>

#include "ops/activation/activation.h"

namespace opforge {

namespace {

double at(const TensorView& t, int64_t row, int64_t i) {
  return load_as_double(t.data, t.dtype, row * t.row_stride() + i);
}
void put(const TensorView& t, int64_t row, int64_t i, double v) {
  store_from_double(t.data, t.dtype, row * t.row_stride() + i, v);
}

double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

}  // namespace

void silu_and_mul_reference(const Context&, const TensorView& y, const TensorView& x) {
  const int64_t rows = x.rows(), d = x.size(-1) / 2;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < d; ++i) {
      const double a = at(x, row, i), b = at(x, row, d + i);
      put(y, row, i, a * sigmoid(a) * b);
    }
  }
}

void silu_and_mul_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                     const TensorView& x) {
  const int64_t rows = x.rows(), d = x.size(-1) / 2;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t i = 0; i < d; ++i) {
      const double a = at(x, row, i), b = at(x, row, d + i), g = at(dy, row, i);
      const double s = sigmoid(a);
      put(dx, row, i, g * b * s * (1.0 + a * (1.0 - s)));  // d silu(a) / da = s (1 + a (1 - s))
      put(dx, row, d + i, g * a * s);
    }
  }
}

}  // namespace opforge
