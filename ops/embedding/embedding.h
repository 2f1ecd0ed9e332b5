// Embedding family: embedding and embedding_backward.
//
// Greppable chain: op `embedding` -> embedding_reference (reference.cpp), embedding_cpu (cpu.cpp).
// Cases in cases.cpp, checks / shapes / costs in embedding.cpp. w and y follow Note [row layout]
// (ops/norm/norm.h); ids are a contiguous int32 or int64 tensor of any shape.
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

struct Embedding {
  static constexpr const char* name = "embedding";
  static constexpr const char* backward = "embedding_backward";
  using Signature = void(const TensorView& y, const TensorView& ids, const TensorView& w,
                         int64_t padding_idx);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"ids", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"padding_idx", ArgRole::scalar, "-1"}};
  static constexpr const char* doc =
      "y[i, :] = w[ids[i], :], as torch.nn.functional.embedding. ids: int32 or int64 of any "
      "shape (contiguous), every value in [0, vocab) (checked before anything is written), w: "
      "[vocab, dim], y: ids.shape + [dim] of w's dtype; rows are copied bit for bit. padding_idx "
      "only affects the backward (its row gets no gradient); -1 means none. Differs from PyTorch: "
      "a negative padding_idx other than -1 is an error (PyTorch counts it from the end), and "
      "there is no max_norm renormalisation; vLLM's vocab-parallel masking of ids outside a "
      "shard is not done here (an out-of-range id is an error).";
  static void check(const TensorView& y, const TensorView& ids, const TensorView& w,
                    int64_t padding_idx);
};

struct EmbeddingBackward {
  static constexpr const char* name = "embedding_backward";
  using Signature = void(const TensorView& dw, const TensorView& dy, const TensorView& ids,
                         const TensorView& w, int64_t padding_idx);
  static constexpr ArgSpec args[] = {{"dw", ArgRole::out},
                                     {"dy", ArgRole::in},
                                     {"ids", ArgRole::in},
                                     {"w", ArgRole::in},
                                     {"padding_idx", ArgRole::scalar, "-1"}};
  static constexpr const char* doc =
      "dw[v, :] = sum of dy[i, :] over the tokens i with ids[i] == v, in token order; the row "
      "of padding_idx (when not -1) and rows no token uses are 0. w is read for its shape and "
      "dtype only. Ids out of range (possible only on a device) contribute nothing. "
      "Deterministic: each vocab row is summed in f32 by one thread in increasing "
      "token order (Liger's embedding uses atomic adds, whose order varies run to run).";
  static void check(const TensorView& dw, const TensorView& dy, const TensorView& ids,
                    const TensorView& w, int64_t padding_idx);
};

void embedding_reference(const Context&, const TensorView& y, const TensorView& ids,
                         const TensorView& w, int64_t padding_idx);
void embedding_backward_reference(const Context&, const TensorView& dw, const TensorView& dy,
                                  const TensorView& ids, const TensorView& w, int64_t padding_idx);

void register_embedding(Registry& reg);  // embedding.cpp: ops, reference + cpu kernels, cases

}  // namespace opforge
