// Harness cases of the embedding family (see Case in opforge/op.h).
//
// Small and medium shapes with int64 and int32 ids, repeated ids (the backward's sums), a
// padding_idx that occurs in ids, large model shapes (vocab 32000 x dim 4096; 1 / 16 / 1024 /
// 16384 tokens), and edge cases: no tokens, one element, odd dims, 2-d ids, padded rows of w and
// of y / dy, a vocab row no token uses. Cases where padding_idx occurs in ids belong to the
// backward op only: the gradient PyTorch defines there (none for that row) is not the derivative
// of the forward, so grad mode's finite differences (which use the forward's cases) cannot check
// it; tests/linear_embedding_test.cpp checks those values by hand.
#include <string>
#include <utility>

#include "ops/embedding/internal.h"

namespace opforge {

namespace {

struct EmbeddingShape {
  Shape ids;
  int64_t vocab = 0, dim = 0;
  DType id_dtype = DType::i64;
  int64_t padding_idx = -1;
  std::vector<double> id_values;  // cycled; empty: uniform in [0, vocab)
  int64_t w_pad = 0, rows_pad = 0;  // rows_pad: y (forward) or dy (backward)
};

Case embedding_case(bool backward, std::string label, CaseGroup group, const EmbeddingShape& s) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  TensorInit ids;
  ids.shape = s.ids;
  ids.fixed_dtype = true;
  ids.dtype = s.id_dtype;
  if (s.id_values.empty()) {
    ids.fill = Fill::integers;
    ids.low = 0;
    ids.high = double(s.vocab);
  } else {
    ids.fill = Fill::values;
    ids.values = s.id_values;
  }
  c.args.push_back({"ids", ids});
  TensorInit w;
  w.shape = Shape{s.vocab, s.dim};
  w.row_pad = s.w_pad;
  c.args.push_back({"w", w});
  Shape rows = s.ids;
  rows.dims[size_t(rows.ndim)] = s.dim;
  ++rows.ndim;
  if (backward || s.rows_pad > 0) {
    TensorInit t;
    t.shape = rows;
    t.row_pad = s.rows_pad;
    t.fill = Fill::normal;
    c.args.push_back({backward ? "dy" : "y", t});
  }
  c.args.push_back({"padding_idx", Value(s.padding_idx)});
  return c;
}

std::vector<Case> embedding_family_cases(bool backward) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, EmbeddingShape s) {
    cases.push_back(embedding_case(backward, std::move(label), group, s));
  };
  add("8_v16_d32", CaseGroup::small, {{8}, 16, 32});
  add("2x5_v7_d33_int32_repeats", CaseGroup::small, {{2, 5}, 7, 33, DType::i32, -1, {3, 1, 3, 0, 6, 3, 1, 2, 3, 0}});
  if (backward) add("10_v7_d33_padding3", CaseGroup::small, {{10}, 7, 33, DType::i64, 3, {3, 1, 3, 0, 6, 3, 1, 2, 3, 0}});
  add("256_v4096_d512", CaseGroup::medium, {{256}, 4096, 512});
  add("1024_v32_d512_int32_hot_rows", CaseGroup::medium, {{1024}, 32, 512, DType::i32});
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "_v32000_d4096", CaseGroup::large, {{tokens}, 32000, 4096});
  add("0_v5_d16", CaseGroup::edge, {{0}, 5, 16});
  add("1_v1_d1", CaseGroup::edge, {{1}, 1, 1});
  add("7_v9_d67_unused_rows", CaseGroup::edge, {{7}, 9, 67, DType::i64, -1, {0, 2, 2, 8, 0, 5, 2}});
  add("9_v6_d67_rows_pad3_padding_unused", CaseGroup::edge, {{9}, 6, 67, DType::i64, 4, {0, 1, 0, 5, 3, 0, 2}, 2, 3});
  add("3x4_v11_d40_w_pad5", CaseGroup::edge, {{3, 4}, 11, 40, DType::i32, -1, {}, 5, 0});
  if (backward) add("9_v6_d67_rows_pad3_padding0", CaseGroup::edge, {{9}, 6, 67, DType::i64, 0, {0, 1, 0, 5, 3, 0, 2, 4, 0}, 2, 3});
  return cases;
}

}  // namespace

std::vector<Case> embedding_cases() { return embedding_family_cases(false); }
std::vector<Case> embedding_backward_cases() { return embedding_family_cases(true); }

}  // namespace opforge
