// CPU kernels of the embedding family: embedding_cpu, embedding_backward_cpu.
//
// Assumes: ids contiguous int32 / int64, already range-checked by the op's check; w, y, dy, dw
// with Note [row layout]; f32 / bf16 / f16 (f64: the reference kernel).
//
// Why it is fast:
// - Forward is a gather of whole rows: y and w share a dtype, so rows are copied as bytes
//   (cpu::gather_rows, Note [row gather]: memcpy, or past the cache share non-temporal stores
//   with the next row prefetched), no conversion and no arithmetic; OpenMP over blocks of tokens
//   sized by Note [tiling] (one block's y rows in half of L2). It moves ids + 2 x tokens x dim
//   elements, the roofline minimum.
// - Backward is deterministic by construction, not by atomics: a stable counting sort (one pass
//   over ids, O(tokens + vocab)) lists each vocab row's tokens in increasing token order; vocab
//   rows are then split into blocks (Note [tiling]) across OpenMP threads, each row owned by one
//   thread, which sums its dy rows in f32 Highway vectors in token order and rounds once into
//   dw. The result does not depend on the thread count. Rows without tokens (and padding_idx)
//   are written as zeros in the same pass, so dw is written exactly once, past the cache by
//   non-temporal stores as the forward's y.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/embedding/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"
#include "ops/embedding/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::embedding_simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

using BackwardRows = EmbeddingBackwardRows;

// dw rows [v0, v1): sums of their tokens' dy rows, in token order, through f32 `acc` (dim long).
template <class T, bool kStream>
void sum_rows_typed(const BackwardRows& a, int64_t v0, int64_t v1, float* acc) {
  const T* dy = static_cast<const T*>(a.dy);
  T* dw = static_cast<T*>(a.dw);
  // A whole vector at an offset of whole vectors from a 64-byte aligned row start is aligned.
  auto put_row = [&](T* out, auto&& value) {
    for_each_vector(a.dim, [&](int64_t j, size_t count) {
      if (kStream && count == hn::Lanes(DF())) store<true>(value(j, count), out + j);
      else store_n(value(j, count), out + j, count);
    });
  };
  for (int64_t v = v0; v < v1; ++v) {
    const int64_t begin = a.starts[v], end = a.starts[v + 1];
    T* out = dw + v * a.dw_stride;
    // Most rows of a large vocabulary have no token or one (at 16,384 tokens over 32,000 rows, 60%
    // and 31%): written straight from zero or from 0 + the dy row, the same values as the sum below.
    if (end - begin <= 1) {
      const T* row = end > begin ? dy + a.order[begin] * a.dy_stride : nullptr;
      put_row(out, [&](int64_t j, size_t count) {
        return row ? hn::Add(hn::Zero(DF()), load_n(row + j, count)) : hn::Zero(DF());
      });
      continue;
    }
    for_each_vector(a.dim, [&](int64_t j, size_t count) { store_n(hn::Zero(DF()), acc + j, count); });
    for (int64_t k = begin; k < end; ++k) {
      const T* row = dy + a.order[k] * a.dy_stride;
      for_each_vector(a.dim, [&](int64_t j, size_t count) {
        store_n(hn::Add(load_n(acc + j, count), load_n(row + j, count)), acc + j, count);
      });
    }
    put_row(out, [&](int64_t j, size_t count) { return load_n(acc + j, count); });
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <class T> void sum_rows_for(const BackwardRows& a, int64_t v0, int64_t v1, float* acc) {
  if (a.stream) sum_rows_typed<T, true>(a, v0, v1, acc);
  else sum_rows_typed<T, false>(a, v0, v1, acc);
}

void sum_rows(const BackwardRows& a, DType dtype, int64_t v0, int64_t v1, float* acc) {
  switch (dtype) {
    case DType::bf16: return sum_rows_for<bf16_t>(a, v0, v1, acc);
    case DType::f16: return sum_rows_for<f16_t>(a, v0, v1, acc);
    default: return sum_rows_for<float>(a, v0, v1, acc);
  }
}

}  // namespace opforge::embedding_simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cstring>
#include <memory>
#include <vector>

#include "backends/cpu/gather.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace embedding_simd {
HWY_EXPORT(sum_rows);
}  // namespace embedding_simd

namespace {

const char* dtype_reason(const TensorView& w) {
  if (!w.device.is_cpu()) return "tensors are not on the cpu";
  switch (w.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

// Blocks of rows whose `bytes_per_element` x dim working set fits half of L2 (Note [tiling]).
cpu::RowTasks row_blocks(int64_t rows, int64_t dim, int64_t bytes_per_element) {
  cpu::TileSpec spec;
  spec.bytes_per_element = bytes_per_element;
  spec.multiplier = std::max<int64_t>(dim, 1);
  spec.level = cpu::CacheLevel::l2;
  return cpu::row_blocks(rows, spec);
}

}  // namespace

void embedding_cpu(const Context&, const TensorView& y, const TensorView& ids, const TensorView& w,
                   int64_t) {
  const int64_t tokens = ids.numel(), dim = w.size(1), item = w.itemsize();
  const size_t row_bytes = size_t(dim * item);
  const char* src = static_cast<const char*>(w.data);
  char* dst = static_cast<char*>(y.data);
  const int64_t w_stride = w.row_stride() * item, y_stride = y.row_stride() * item;
  const cpu::RowTasks blocks = cpu::balanced(row_blocks(tokens, dim, 2 * item));  // Note [balanced tasks]
  const cpu::RowGather g{dst, y_stride, src, w_stride, int64_t(row_bytes), ids.data, ids.dtype == DType::i64};
  // Note [streaming stores]: y past the cache share goes out by non-temporal stores.
  const bool stream = cpu::stream_outputs(2.0 * double(tokens) * double(row_bytes), {&y});
  cpu::parallel_tasks(blocks.count(), [&](int64_t task) {
    cpu::gather_rows(g, blocks.begin(task), blocks.end(task), stream);  // Note [row gather]
  });
}

void embedding_backward_cpu(const Context&, const TensorView& dw, const TensorView& dy,
                            const TensorView& ids, const TensorView& w, int64_t padding_idx) {
  const int64_t tokens = ids.numel(), vocab = w.size(0), dim = w.size(1);
  // Stable counting sort of the tokens by id (padding_idx left out).
  std::vector<int64_t> starts(size_t(vocab + 1), 0), order(size_t(std::max<int64_t>(tokens, 1)));
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t id = id_at(ids, i);
    if (id != padding_idx) ++starts[size_t(id + 1)];
  }
  for (int64_t v = 0; v < vocab; ++v) starts[size_t(v + 1)] += starts[size_t(v)];
  {
    std::vector<int64_t> next(starts.begin(), starts.end() - 1);
    for (int64_t i = 0; i < tokens; ++i) {
      const int64_t id = id_at(ids, i);
      if (id != padding_idx) order[size_t(next[size_t(id)]++)] = i;
    }
  }
  EmbeddingBackwardRows a;
  a.dy = dy.data;
  a.dy_stride = dy.row_stride();
  a.dw = dw.data;
  a.dw_stride = dw.row_stride();
  a.dim = dim;
  a.order = order.data();
  a.starts = starts.data();
  a.stream = cpu::stream_outputs(double(vocab) * double(dim * dw.itemsize()) + double(bytes_of(dy)), {&dw});
  // Vocab rows per task: Note [tiling] with one f32 accumulator row and a dw row per unit.
  const cpu::RowTasks blocks = row_blocks(vocab, dim, 4 + dw.itemsize());
  auto* sum_fn = HWY_DYNAMIC_DISPATCH(embedding_simd::sum_rows);
  cpu::parallel_tasks(blocks.count(), [&](int64_t task) {
    std::unique_ptr<float[]> acc(new float[size_t(std::max<int64_t>(dim, 1))]);
    sum_fn(a, dw.dtype, blocks.begin(task), blocks.end(task), acc.get());
  });
}

const char* embedding_cpu_applicable(const TensorView&, const TensorView&, const TensorView& w,
                                     int64_t) {
  return dtype_reason(w);
}

const char* embedding_backward_cpu_applicable(const TensorView&, const TensorView&,
                                              const TensorView&, const TensorView& w, int64_t) {
  return dtype_reason(w);
}

}  // namespace opforge
#endif  // HWY_ONCE
