// Embedding family: checks, shape functions, cost models and registration (embedding.h).
#include <string>

#include "opforge/checks.h"
#include "opforge/error.h"
#include "ops/embedding/internal.h"

namespace opforge {

namespace {

// ids.shape + [dim].
Shape rows_shape(const TensorView& ids, int64_t dim) {
  Shape s = ids.shape_of();
  s.dims[size_t(s.ndim)] = dim;
  ++s.ndim;
  return s;
}

// ids: int32/int64, contiguous, values in [0, vocab), at most kMaxDims - 1 dims; w: [vocab, dim]
// floating with Note [row layout]; padding_idx -1 or in [0, vocab).
void check_ids_and_w(const char* op, const TensorView& ids, const TensorView& w,
                     int64_t padding_idx) {
  expect_defined(op, "w", w);
  expect_floating(op, "w", w);
  if (w.ndim != 2) throw_argument_error(op, "w", "a 2-d tensor [vocab, dim]", w.str());
  expect_rows_uniform(op, "w", w);
  expect_defined(op, "ids", ids);
  if (ids.dtype != DType::i32 && ids.dtype != DType::i64)
    throw_argument_error(op, "ids", "dtype int32 or int64", dtype_name(ids.dtype));
  if (ids.ndim >= kMaxDims)
    throw_argument_error(op, "ids", "at most " + std::to_string(kMaxDims - 1) + " dims", ids.str());
  if (!ids.is_contiguous()) throw_argument_error(op, "ids", "a contiguous tensor", ids.str());
  expect_same_device(op, "ids", ids, "w", w);
  const int64_t vocab = w.size(0);
  // Ids on a device are not read here (that would synchronize); the device kernels guard them.
  for (int64_t i = 0; ids.device.is_cpu() && i < ids.numel(); ++i) {
    const int64_t id = id_at(ids, i);
    if (id < 0 || id >= vocab)
      throw_argument_error(op, "ids", "values in [0, " + std::to_string(vocab) + ")",
                           std::to_string(id) + " at index " + std::to_string(i));
  }
  if (padding_idx != -1 && (padding_idx < 0 || padding_idx >= vocab))
    throw_argument_error(op, "padding_idx", "-1 (none) or a row in [0, " + std::to_string(vocab) + ")",
                         std::to_string(padding_idx));
}

void check_rows(const char* op, const char* arg, const TensorView& t, const TensorView& ids,
                const TensorView& w) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, "w", w);
  expect_shape(op, arg, t, rows_shape(ids, w.size(1)));
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, "w", w);
}

}  // namespace

void Embedding::check(const TensorView& y, const TensorView& ids, const TensorView& w,
                      int64_t padding_idx) {
  check_ids_and_w(name, ids, w, padding_idx);
  check_rows(name, "y", y, ids, w);
  expect_no_overlap(name, "y", y, "ids", ids);
  expect_no_overlap(name, "y", y, "w", w);
}

void EmbeddingBackward::check(const TensorView& dw, const TensorView& dy, const TensorView& ids,
                              const TensorView& w, int64_t padding_idx) {
  check_ids_and_w(name, ids, w, padding_idx);
  check_rows(name, "dy", dy, ids, w);
  expect_defined(name, "dw", dw);
  expect_same_dtype(name, "dw", dw, "w", w);
  expect_shape(name, "dw", dw, w.shape_of());
  expect_rows_uniform(name, "dw", dw);
  expect_same_device(name, "dw", dw, "w", w);
  expect_no_overlap(name, "dw", dw, "dy", dy);
  expect_no_overlap(name, "dw", dw, "ids", ids);
  expect_no_overlap(name, "dw", dw, "w", w);
}

void register_embedding(Registry& reg) {
  OpEntry& op = reg.add_op<Embedding>();
  op.outputs = [](const ArgList& a) {
    const TensorView &ids = a.tensor("ids"), &w = a.tensor("w");
    return std::vector<OutputSpec>{{"y", rows_shape(ids, w.size(1)), w.dtype}};
  };
  op.cost = [](const ArgList& a) {
    const TensorView &ids = a.tensor("ids"), &w = a.tensor("w");
    // Reads ids and one row of w per token, writes y: no flops.
    const double row_bytes = double(w.size(1) * w.itemsize());
    return Cost{bytes_of(ids) + 2.0 * double(ids.numel()) * row_bytes, 0.0};
  };
  op.cases = embedding_cases;
  reg.add_kernel<Embedding>(reference_kernel_desc("plain loops through double, one row per token"),
                            &embedding_reference);
  reg.add_kernel<Embedding>(cpu_kernel_desc("row memcpy gather, OpenMP over token blocks"),
                            &embedding_cpu, &embedding_cpu_applicable);

  OpEntry& bwd = reg.add_op<EmbeddingBackward>();
  bwd.outputs = [](const ArgList& a) {
    const TensorView& w = a.tensor("w");
    return std::vector<OutputSpec>{{"dw", w.shape_of(), w.dtype}};
  };
  bwd.cost = [](const ArgList& a) {
    const TensorView &ids = a.tensor("ids"), &dy = a.tensor("dy"), &w = a.tensor("w");
    // Reads ids and dy, writes every row of dw; one add per element of dy.
    return Cost{bytes_of(ids) + bytes_of(dy) + bytes_of(w), double(dy.numel())};
  };
  bwd.cases = embedding_backward_cases;
  reg.add_kernel<EmbeddingBackward>(
      reference_kernel_desc("plain loops, double sums in token order"), &embedding_backward_reference);
  reg.add_kernel<EmbeddingBackward>(
      cpu_kernel_desc("counting sort of tokens by id, Highway f32 row sums, OpenMP over vocab rows"),
      &embedding_backward_cpu, &embedding_backward_cpu_applicable);
}

}  // namespace opforge
