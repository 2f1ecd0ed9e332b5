// Harness cases of the rotary family (see Case in opforge/op.h).
//
// rotary_embedding: query [T, n_q * head_size] and key [T, n_kv * head_size] with Llama-3-8B's
// 32 query and 8 kv heads of 128 for the medium and large groups (tokens 1 / 16 / 1024 / 16384),
// a real RoPE cache (base 10000) and random positions; small and edge cases cover GPT-J style,
// partial rotary (rotary_dim < head_size), GQA counts, sizes that are not a multiple of any
// vector width, padded rows, a single pair and no tokens. apply_rotary_emb: x [T, heads,
// head_size] with cos / sin of positions 0..T-1, the same shapes, plus an in-place case.
#include <cmath>
#include <string>

#include "ops/rotary/internal.h"

namespace opforge {

namespace {

// cos(p * f_i) (or sin) for rows p in [0, rows), i in [0, half), f_i = 10000^(-2i / (2 half)).
std::vector<double> rope_table(int64_t rows, int64_t half, bool sine) {
  std::vector<double> v(size_t(rows * half));
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * std::pow(10000.0, -double(2 * i) / double(2 * half));
      v[size_t(p * half + i)] = sine ? std::sin(angle) : std::cos(angle);
    }
  return v;
}

}  // namespace

std::vector<double> rope_cos_sin_cache(int64_t max_pos, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  std::vector<double> c = rope_table(max_pos, half, false), s = rope_table(max_pos, half, true);
  std::vector<double> v(size_t(max_pos * rotary_dim));
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      v[size_t(p * rotary_dim + i)] = c[size_t(p * half + i)];
      v[size_t(p * rotary_dim + half + i)] = s[size_t(p * half + i)];
    }
  return v;
}

namespace {

TensorInit values_tensor(Shape shape, std::vector<double> values) {
  TensorInit t;
  t.shape = shape;
  t.fill = Fill::values;
  t.values = std::move(values);
  return t;
}

TensorInit rows_tensor(Shape shape, int64_t pad) {
  TensorInit t;
  t.shape = shape;
  t.row_pad = pad;
  return t;
}

struct EmbeddingShape {
  int64_t tokens, n_q, n_kv, head_size, rotary_dim;
  bool neox = true;
  int64_t pad = 0;
  int64_t max_pos = 0;  // 0: 2 * tokens + 8
};

Case embedding_case(bool backward, std::string label, CaseGroup group, const EmbeddingShape& s) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  const int64_t max_pos = s.max_pos > 0 ? s.max_pos : 2 * s.tokens + 8;
  TensorInit positions;
  positions.shape = Shape{s.tokens};
  positions.fill = Fill::integers;
  positions.low = 0;
  positions.high = double(max_pos);
  positions.fixed_dtype = true;
  positions.dtype = DType::i64;
  c.args.push_back({"positions", positions});
  c.args.push_back({backward ? "dquery" : "query", rows_tensor({s.tokens, s.n_q * s.head_size}, s.pad)});
  c.args.push_back({backward ? "dkey" : "key", rows_tensor({s.tokens, s.n_kv * s.head_size}, s.pad)});
  c.args.push_back({"cos_sin_cache", values_tensor({max_pos, s.rotary_dim},
                                                   rope_cos_sin_cache(max_pos, s.rotary_dim))});
  c.args.push_back({"head_size", Value(s.head_size)});
  c.args.push_back({"is_neox", Value(s.neox)});
  return c;
}

std::vector<Case> embedding_cases(bool backward) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, EmbeddingShape s) {
    cases.push_back(embedding_case(backward, std::move(label), group, s));
  };
  add("t4_q4_kv2_h64", CaseGroup::small, {4, 4, 2, 64, 64});
  add("t4_q4_kv2_h64_gptj", CaseGroup::small, {4, 4, 2, 64, 64, false});
  add("t5_q2_kv1_h64_rot32", CaseGroup::small, {5, 2, 1, 64, 32});
  add("t5_q2_kv1_h64_rot32_gptj", CaseGroup::small, {5, 2, 1, 64, 32, false});
  add("t16_q32_kv8_h128", CaseGroup::medium, {16, 32, 8, 128, 128});
  add("t16_q32_kv8_h128_gptj", CaseGroup::medium, {16, 32, 8, 128, 128, false});
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "_q32_kv8_h128", CaseGroup::large,
        {tokens, 32, 8, 128, 128, true, 0, 16384});
  add("t0_q4_kv2_h64", CaseGroup::edge, {0, 4, 2, 64, 64});
  add("t1_q1_kv1_h2", CaseGroup::edge, {1, 1, 1, 2, 2});
  add("t3_q3_kv1_h70_rot34", CaseGroup::edge, {3, 3, 1, 70, 34});
  add("t3_q3_kv1_h70_rot34_gptj", CaseGroup::edge, {3, 3, 1, 70, 34, false});
  add("t3_q5_kv5_h6", CaseGroup::edge, {3, 5, 5, 6, 6, false});
  add("t5_q2_kv1_h64_pad8", CaseGroup::edge, {5, 2, 1, 64, 64, true, 8});
  add("t5_q2_kv1_h66_rot18_gptj_pad3", CaseGroup::edge, {5, 2, 1, 66, 18, false, 3});
  return cases;
}

struct ApplyShape {
  int64_t tokens, heads, head_size, rotary_dim;
  bool neox = true;
  int64_t input_pad = 0, output_pad = 0;
  bool in_place = false;
};

Case apply_case(bool backward, std::string label, CaseGroup group, const ApplyShape& s) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  const int64_t half = s.rotary_dim / 2;
  c.args.push_back({backward ? "dy" : "x", rows_tensor({s.tokens, s.heads, s.head_size}, s.input_pad)});
  c.args.push_back({"cos", values_tensor({s.tokens, half}, rope_table(s.tokens, half, false))});
  c.args.push_back({"sin", values_tensor({s.tokens, half}, rope_table(s.tokens, half, true))});
  c.args.push_back({"is_neox", Value(s.neox)});
  if (s.output_pad > 0)
    c.args.push_back({backward ? "dx" : "y", rows_tensor({s.tokens, s.heads, s.head_size}, s.output_pad)});
  if (s.in_place) c.in_place = {backward ? std::pair<std::string, std::string>{"dx", "dy"}
                                         : std::pair<std::string, std::string>{"y", "x"}};
  return c;
}

std::vector<Case> apply_cases(bool backward) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, ApplyShape s) {
    cases.push_back(apply_case(backward, std::move(label), group, s));
  };
  add("t4_h4_d64", CaseGroup::small, {4, 4, 64, 64});
  add("t4_h4_d64_gptj", CaseGroup::small, {4, 4, 64, 64, false});
  add("t5_h2_d64_rot32", CaseGroup::small, {5, 2, 64, 32});
  add("t16_h32_d128", CaseGroup::medium, {16, 32, 128, 128});
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "_h32_d128", CaseGroup::large, {tokens, 32, 128, 128});
  add("t0_h4_d64", CaseGroup::edge, {0, 4, 64, 64});
  add("t1_h1_d2", CaseGroup::edge, {1, 1, 2, 2});
  add("t3_h3_d70_rot34_gptj", CaseGroup::edge, {3, 3, 70, 34, false});
  add("t3_h5_d6", CaseGroup::edge, {3, 5, 6, 6});
  add("t5_h2_d66_rot18_pads", CaseGroup::edge, {5, 2, 66, 18, true, 8, 5});
  add("t5_h2_d66_rot18_gptj_in_place", CaseGroup::edge, {5, 2, 66, 18, false, 0, 0, true});
  add("t16_h32_d128_in_place_pad8", CaseGroup::edge, {16, 32, 128, 128, true, 8, 0, true});
  return cases;
}

}  // namespace

std::vector<Case> rotary_embedding_cases() { return embedding_cases(false); }
std::vector<Case> rotary_embedding_backward_cases() { return embedding_cases(true); }
std::vector<Case> apply_rotary_emb_cases() { return apply_cases(false); }
std::vector<Case> apply_rotary_emb_backward_cases() { return apply_cases(true); }

}  // namespace opforge
