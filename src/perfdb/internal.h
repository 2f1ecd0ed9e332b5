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

// "a=1, b=2" in the table's column order.
std::string dims_text(const Dims& dims, const std::vector<std::string>& order);

}  // namespace opforge::perfdb::detail
