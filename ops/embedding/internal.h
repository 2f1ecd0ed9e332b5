// Embedding family internals shared by embedding.cpp, the kernels and cases.cpp (not installed).
#pragma once

#include <vector>

#include "ops/embedding/embedding.h"

namespace opforge {

// ---- cpu.cpp ----------------------------------------------------------------------------------
void embedding_cpu(const Context&, const TensorView& y, const TensorView& ids, const TensorView& w,
                   int64_t padding_idx);
void embedding_backward_cpu(const Context&, const TensorView& dw, const TensorView& dy,
                            const TensorView& ids, const TensorView& w, int64_t padding_idx);
const char* embedding_cpu_applicable(const TensorView& y, const TensorView& ids,
                                     const TensorView& w, int64_t padding_idx);
const char* embedding_backward_cpu_applicable(const TensorView& dw, const TensorView& dy,
                                              const TensorView& ids, const TensorView& w,
                                              int64_t padding_idx);

// ---- embedding.cpp ------------------------------------------------------------------------------
// ids[i] (flat index into a contiguous int32 / int64 tensor) as int64.
inline int64_t id_at(const TensorView& ids, int64_t i) {
  return ids.dtype == DType::i32 ? int64_t(static_cast<const int32_t*>(ids.data)[i])
                                 : static_cast<const int64_t*>(ids.data)[i];
}

// What cpu.cpp's per-target backward code receives (plain data; strides in elements).
struct EmbeddingBackwardRows {
  const void* dy = nullptr;
  int64_t dy_stride = 0;
  void* dw = nullptr;
  int64_t dw_stride = 0;
  int64_t dim = 0;
  const int64_t* order = nullptr;   // token indices grouped by id, increasing within a group
  const int64_t* starts = nullptr;  // tokens of row v: order[starts[v] .. starts[v + 1])
  bool stream = false;              // dw rows 64-byte aligned, written non-temporally
};

// ---- cases.cpp ----------------------------------------------------------------------------------
std::vector<Case> embedding_cases();
std::vector<Case> embedding_backward_cases();

}  // namespace opforge
