// Reference kernels of the embedding family: the oracle of the harness and every policy's last
// resort. Token i is row i of y / dy (ids flattened in C order, Note [row layout] for the rows).
#include <vector>

#include "ops/embedding/internal.h"

namespace opforge {

void embedding_reference(const Context&, const TensorView& y, const TensorView& ids,
                         const TensorView& w, int64_t) {
  const int64_t tokens = ids.numel(), dim = w.size(1);
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t row = id_at(ids, i);
    for (int64_t j = 0; j < dim; ++j)
      store_from_double(y.data, y.dtype, i * y.row_stride() + j,
                        load_as_double(w.data, w.dtype, row * w.row_stride() + j));
  }
}

void embedding_backward_reference(const Context&, const TensorView& dw, const TensorView& dy,
                                  const TensorView& ids, const TensorView& w, int64_t padding_idx) {
  const int64_t tokens = ids.numel(), vocab = w.size(0), dim = w.size(1);
  std::vector<double> sums(size_t(vocab * dim), 0.0);
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t row = id_at(ids, i);
    if (row == padding_idx) continue;
    for (int64_t j = 0; j < dim; ++j)
      sums[size_t(row * dim + j)] += load_as_double(dy.data, dy.dtype, i * dy.row_stride() + j);
  }
  for (int64_t v = 0; v < vocab; ++v)
    for (int64_t j = 0; j < dim; ++j)
      store_from_double(dw.data, dw.dtype, v * dw.row_stride() + j, sums[size_t(v * dim + j)]);
}

}  // namespace opforge
