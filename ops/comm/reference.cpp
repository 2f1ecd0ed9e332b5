// Reference kernel of the communication family: the oracle of the harness. Rank r's buffer is row
// r of x (Note [stacked ranks]); each element is summed over the ranks in rank order in double.
#include "ops/comm/comm.h"

namespace opforge {

void all_reduce_reference(const Context&, const TensorView& y, const TensorView& x) {
  const int64_t ranks = x.size(0);
  const int64_t n = ranks > 0 ? x.numel() / ranks : 0;  // elements of one rank's buffer
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t r = 0; r < ranks; ++r) sum += load_as_double(x.data, x.dtype, r * n + i);
    for (int64_t r = 0; r < ranks; ++r) store_from_double(y.data, y.dtype, r * n + i, sum);
  }
}

}  // namespace opforge
