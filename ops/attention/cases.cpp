// Harness cases of the attention family (see Case in opforge/op.h).
//
// Prefill: packed batches given by their sequence lengths; small and medium shapes, a large
// model-like shape kept tractable for the reference (2 sequences x 512 tokens, 32 query / 8 kv
// heads of 128), and edge cases: a one-token sequence, an empty sequence inside the batch, no
// tokens at all, head_dim not a multiple of any vector width, a window shorter than the sequence,
// GQA ratios 1 / 4 / 8, int64 offsets, an explicit scale, padded rows.
// Decode: batch 8, 32 and 256 with a 2048-token cache (large), two sequences of 1500 and 777
// tokens (medium), and edge cases: a sequence of length 0, length 1, a full cache, odd head_dim,
// GQA ratios, padded rows, no sequences, one sequence (its kv heads split over tasks), and lengths
// that end inside / just past / exactly at a key split of the CUDA kernels.
// The backward ops see the forward's shapes with dout, out ~ N(0, 1) and lse ~ U(2, 4): they are
// compared with the reference backward on the same inputs; grad mode derives its inputs from the
// forward instead.
#include <numeric>
#include <string>
#include <utility>

#include "ops/attention/internal.h"

namespace opforge {

namespace {

struct Heads {
  int64_t q = 4, kv = 2, dim = 16;
};

struct PrefillSpec {
  std::vector<int64_t> lens;
  Heads heads;
  bool causal = true;
  int64_t window_left = -1;
  double scale = 0;
  DType offsets = DType::i32;
  int64_t pad = 0;  // row padding of every [tokens, heads, dim] tensor, outputs included
};

TensorInit heads_tensor(int64_t tokens, int64_t heads, int64_t dim, int64_t pad,
                        Fill fill = Fill::normal_outliers) {
  TensorInit t;
  t.shape = Shape{tokens, heads, dim};
  t.fill = fill;
  t.row_pad = pad;
  return t;
}

TensorInit index_tensor(const std::vector<int64_t>& values, DType dtype) {
  TensorInit t;
  t.shape = Shape{int64_t(values.size())};
  t.fill = Fill::values;
  t.fixed_dtype = true;
  t.dtype = dtype;
  t.values.assign(values.begin(), values.end());
  return t;
}

Case prefill_case(bool backward, std::string label, CaseGroup group, const PrefillSpec& s) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  const int64_t tokens = std::accumulate(s.lens.begin(), s.lens.end(), int64_t(0));
  const Heads& h = s.heads;
  // The backward's random inputs stay moderate: p = exp(q.k scale - lse) with outliers in q and k
  // would reach 1e10 and test little but f32 range.
  const Fill fill = backward ? Fill::normal : Fill::normal_outliers;
  c.args.push_back({"q", heads_tensor(tokens, h.q, h.dim, s.pad, fill)});
  c.args.push_back({"k", heads_tensor(tokens, h.kv, h.dim, s.pad, fill)});
  c.args.push_back({"v", heads_tensor(tokens, h.kv, h.dim, s.pad)});
  std::vector<int64_t> cu{0};
  for (int64_t n : s.lens) cu.push_back(cu.back() + n);
  c.args.push_back({"cu_seqlens", index_tensor(cu, s.offsets)});
  if (backward) {
    c.args.push_back({"dout", heads_tensor(tokens, h.q, h.dim, s.pad, Fill::normal)});
    c.args.push_back({"out", heads_tensor(tokens, h.q, h.dim, s.pad, Fill::normal)});
    TensorInit lse;
    lse.shape = Shape{h.q, tokens};
    lse.fill = Fill::uniform;
    lse.low = 2.0;
    lse.high = 4.0;
    lse.fixed_dtype = true;
    lse.dtype = DType::f32;
    c.args.push_back({"lse", lse});
  }
  if (s.pad > 0) {
    if (backward) {
      c.args.push_back({"dq", heads_tensor(tokens, h.q, h.dim, s.pad)});
      c.args.push_back({"dk", heads_tensor(tokens, h.kv, h.dim, s.pad)});
      c.args.push_back({"dv", heads_tensor(tokens, h.kv, h.dim, s.pad)});
    } else {
      c.args.push_back({"out", heads_tensor(tokens, h.q, h.dim, s.pad)});
    }
  }
  c.args.push_back({"causal", Value(s.causal)});
  c.args.push_back({"softmax_scale", Value(s.scale)});
  c.args.push_back({"window_left", Value(s.window_left)});
  return c;
}

std::vector<Case> prefill_cases(bool backward) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, PrefillSpec s) {
    cases.push_back(prefill_case(backward, std::move(label), group, s));
  };
  using G = CaseGroup;
  add("lens5,7_h4kv2_d16", G::small, {{5, 7}, {4, 2, 16}});
  add("lens6,3_h2kv2_d8_noncausal", G::small, {{6, 3}, {2, 2, 8}, false});
  add("lens9_h4kv1_d16_window3", G::small, {{9}, {4, 1, 16}, true, 3});
  add("lens64,100,37_h8kv2_d64", G::medium, {{64, 100, 37}, {8, 2, 64}});
  add("lens130_h8kv8_d128_window32", G::medium, {{130}, {8, 8, 128}, true, 32});
  add("lens512,512_h32kv8_d128", G::large, {{512, 512}, {32, 8, 128}});
  add("lens1024_h32kv8_d128_window256", G::large, {{1024}, {32, 8, 128}, true, 255});
  add("lens1_h4kv2_d16", G::edge, {{1}, {4, 2, 16}});
  add("lens3,0,5_empty_sequence", G::edge, {{3, 0, 5}, {4, 2, 16}});
  add("no_tokens", G::edge, {{0}, {4, 2, 16}});
  add("no_sequences", G::edge, {{}, {4, 2, 16}});
  add("lens7,4_d13", G::edge, {{7, 4}, {2, 1, 13}});
  add("lens11_d67_noncausal", G::edge, {{11}, {2, 2, 67}, false});
  add("lens9_window2_shorter_than_sequence", G::edge, {{9}, {4, 2, 16}, true, 2});
  add("lens9_window0_self_only", G::edge, {{9}, {2, 2, 8}, true, 0});
  add("lens8_noncausal_window3", G::edge, {{8}, {2, 1, 8}, false, 3});
  add("lens6,5_gqa1_h4kv4", G::edge, {{6, 5}, {4, 4, 16}});
  add("lens6,5_gqa4_h8kv2", G::edge, {{6, 5}, {8, 2, 16}});
  add("lens6,5_gqa8_h8kv1", G::edge, {{6, 5}, {8, 1, 16}});
  add("lens5,6_int64_offsets", G::edge, {{5, 6}, {4, 2, 16}, true, -1, 0.0, DType::i64});
  add("lens7_scale0.3", G::edge, {{7}, {2, 2, 16}, true, -1, 0.3});
  add("lens5,4_rows_pad3", G::edge, {{5, 4}, {4, 2, 19}, true, -1, 0.0, DType::i32, 3});
  add("lens33_d128_gqa4", G::edge, {{33}, {8, 2, 128}});
  // A head_dim past 256 and odd (first found by check --fuzz): f32 scores over 389 terms.
  add("lens130_h4kv4_d389_window32", G::edge, {{130}, {4, 4, 389}, true, 32});
  // Tiles of 64 query rows that straddle sequences (the CUDA tensor-core kernel's shapes).
  add("lens70,3,90_d64_noncausal", G::edge, {{70, 3, 90}, {4, 2, 64}, false});
  add("lens100,0,33_d128_window40", G::edge, {{100, 0, 33}, {4, 1, 128}, true, 40});
  add("lens50,80_d64_noncausal_window20_pad8", G::edge,
      {{50, 80}, {2, 2, 64}, false, 20, 0.0, DType::i64, 8});
  return cases;
}

struct DecodeSpec {
  std::vector<int64_t> lens;
  int64_t max_ctx = 16;
  Heads heads;
  int64_t pad = 0;
  double scale = 0;
};

Case decode_case(std::string label, CaseGroup group, const DecodeSpec& s) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  const int64_t batch = int64_t(s.lens.size());
  const Heads& h = s.heads;
  c.args.push_back({"q", heads_tensor(batch, h.q, h.dim, s.pad)});
  for (const char* cache : {"k_cache", "v_cache"}) {
    TensorInit t;
    t.shape = Shape{batch, s.max_ctx, h.kv, h.dim};
    t.row_pad = s.pad;
    c.args.push_back({cache, t});
  }
  c.args.push_back({"seq_lens", index_tensor(s.lens, DType::i32)});
  if (s.pad > 0) c.args.push_back({"out", heads_tensor(batch, h.q, h.dim, s.pad)});
  c.args.push_back({"softmax_scale", Value(s.scale)});
  return c;
}

std::vector<int64_t> repeat(std::vector<int64_t> pattern, size_t count) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < count; ++i) out.push_back(pattern[i % pattern.size()]);
  return out;
}

}  // namespace

std::vector<Case> attention_prefill_cases() { return prefill_cases(false); }

std::vector<Case> attention_prefill_backward_cases() { return prefill_cases(true); }

std::vector<Case> attention_decode_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, DecodeSpec s) {
    cases.push_back(decode_case(std::move(label), group, s));
  };
  using G = CaseGroup;
  add("b2_ctx9_h4kv2_d16", G::small, {{5, 9}, 9, {4, 2, 16}});
  add("b3_ctx20_h8kv1_d32", G::small, {{1, 20, 7}, 20, {8, 1, 32}});
  add("b4_ctx256_h32kv8_d128", G::medium, {{256, 100, 17, 200}, 256, {32, 8, 128}});
  add("b8_ctx2048_h32kv8_d128", G::large, {repeat({2048}, 8), 2048, {32, 8, 128}});
  add("b32_ctx2048_h32kv8_d128", G::large, {repeat({2048}, 32), 2048, {32, 8, 128}});
  add("b16_ctx2048_mixed_lens", G::large,
      {repeat({2048, 1000, 1536, 300}, 16), 2048, {32, 8, 128}});
  add("b256_ctx2048_h32kv8_d128", G::large, {repeat({2048}, 256), 2048, {32, 8, 128}});
  add("b1_ctx8192_h32kv8_d128", G::large, {{8192}, 8192, {32, 8, 128}});
  add("b2_ctx1500_h32kv8_d128_mixed", G::medium, {{1500, 777}, 1500, {32, 8, 128}});
  add("b3_len0_in_batch", G::edge, {{4, 0, 6}, 8, {4, 2, 16}});
  add("b2_len1", G::edge, {{1, 1}, 4, {4, 2, 16}});
  add("b0_no_sequences", G::edge, {{}, 4, {4, 2, 16}});
  add("b2_d13", G::edge, {{5, 3}, 5, {2, 1, 13}});
  add("b2_gqa1", G::edge, {{7, 2}, 8, {4, 4, 16}});
  add("b2_gqa8", G::edge, {{7, 2}, 8, {8, 1, 16}});
  add("b2_rows_pad5_scale0.2", G::edge, {{6, 3}, 6, {4, 2, 20}, 5, 0.2});
  add("b3_d128_ctx70", G::edge, {{70, 33, 69}, 70, {8, 2, 128}});
  add("b1_kv_heads_split_across_threads", G::edge, {{45}, 50, {16, 4, 64}});
  // Key splits (the CUDA split kernels cut a sequence into chunks of 256 keys or more, 16 or more
  // under the tuning override OPFORGE_CUDA_DECODE_MIN_CHUNK): lengths that end inside a chunk, one
  // key past a chunk, exactly one chunk, a sequence far shorter than the cache, max_ctx 1, only
  // empty sequences; head_dim 256 / 80 / 32, groups of 3 and 5, padded rows that keep 16-byte
  // alignment.
  add("b3_d128_ctx300_split_tails", G::edge, {{300, 129, 65}, 300, {8, 2, 128}});
  add("b4_d64_lens1,200,0,64", G::edge, {{1, 200, 0, 64}, 200, {4, 1, 64}});
  add("b2_short_sequence_in_long_cache", G::edge, {{10, 500}, 500, {8, 2, 128}});
  add("b1_ctx1_len1", G::edge, {{1}, 1, {4, 1, 128}});
  add("b2_all_len0", G::edge, {{0, 0}, 32, {4, 2, 16}});
  add("b2_d256_gqa2", G::edge, {{100, 37}, 100, {4, 2, 256}});
  add("b2_d32_gqa3", G::edge, {{5, 40}, 40, {6, 2, 32}});
  add("b2_d80_gqa5", G::edge, {{90, 17}, 90, {10, 2, 80}});
  add("b2_d64_rows_pad8", G::edge, {{33, 70}, 70, {8, 2, 64}, 8});
  // 16 query heads per kv head: all 16 rows of the tensor-core kernel's tiles in use.
  add("b2_d128_gqa16", G::edge, {{70, 300}, 300, {32, 2, 128}});
  // Hundreds of splits (more than a combine block has threads), one sequence using only the first.
  add("b2_ctx80000_many_splits_d8", G::edge, {{80000, 3}, 80000, {4, 1, 8}});
  return cases;
}

}  // namespace opforge
