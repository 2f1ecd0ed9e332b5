// Attention family: attention_prefill (variable-length batch), its backward, attention_decode.
//
// Greppable chain: op `attention_prefill` -> attention_prefill_reference (reference.cpp),
// attention_prefill_cpu (cpu.cpp); backward in cpu_backward.cpp. Cases in cases.cpp, checks /
// shapes / costs in attention.cpp.
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

// Note [attention mask]: within one sequence, query position i (0-based inside its sequence)
// sees key position j iff
//   (!causal || j <= i)  and  (window_left < 0 || j >= i - window_left).
// This is flash-attn's window_size = (window_left, causal ? 0 : -1) with equal query and key
// lengths; vLLM's sliding_window = W maps to window_left = W - 1. Query i always sees key i, so
// every query row has at least one key and its softmax is defined. Decode is one query at
// position seq_len - 1 that sees all seq_len keys of its sequence.
//
// Note [attention layout]: q, k, v, out, dq, dk, dv are [tokens, heads, head_dim] with the
// (token, head) rows under Note [row layout] (ops/norm/norm.h): unit-stride head_dim, one
// uniform row stride, so rows may be padded. The KV cache of decode is
// [batch, max_ctx, kv_heads, head_dim] under the same rule. lse is [q_heads, tokens], contiguous
// (flash-attn's varlen layout), f32 (f64 when q is f64).
//
// Note [softmax scale]: softmax_scale <= 0 means 1 / sqrt(head_dim) (the usual default);
// any positive finite value is used as given. NaN and infinity are rejected.

struct AttentionPrefill {
  static constexpr const char* name = "attention_prefill";
  static constexpr const char* backward = "attention_prefill_backward";
  using Signature = void(const TensorView& out, const TensorView& lse, const TensorView& q,
                         const TensorView& k, const TensorView& v, const TensorView& cu_seqlens,
                         bool causal, double softmax_scale, int64_t window_left);
  static constexpr ArgSpec args[] = {{"out", ArgRole::out},
                                     {"lse", ArgRole::out},
                                     {"q", ArgRole::in},
                                     {"k", ArgRole::in},
                                     {"v", ArgRole::in},
                                     {"cu_seqlens", ArgRole::in},
                                     {"causal", ArgRole::scalar, "true"},
                                     {"softmax_scale", ArgRole::scalar, "0"},
                                     {"window_left", ArgRole::scalar, "-1"}};
  static constexpr const char* doc =
      "Variable-length attention over a packed batch. q: [T, Hq, D], k, v: [T, Hkv, D] with Hq a "
      "multiple of Hkv (GQA: query head h reads kv head h / (Hq / Hkv)); cu_seqlens: int32 or "
      "int64 [B + 1], 0 = cu[0] <= cu[1] <= ... <= cu[B] = T, sequence b is tokens "
      "[cu[b], cu[b+1]) (empty sequences allowed; checked when cu_seqlens is on the cpu, on a CUDA "
      "device it sits beside q and the kernels clamp the offsets to [0, T]). For query token i and head h of a sequence: "
      "s_j = scale * q_i . k_j over the keys j it sees (Note [attention mask]: causal, "
      "window_left = -1 for none, flash-attn semantics; vLLM's sliding_window W is window_left "
      "W - 1), out_i = sum_j softmax(s)_j v_j, lse[h, i] = log sum_j exp(s_j) (natural log, "
      "[Hq, T] like flash-attn varlen, f32; f64 for f64 inputs). scale = softmax_scale, or "
      "1/sqrt(D) when softmax_scale <= 0 (Note [softmax scale]). Accumulates in f32 (f64 for f64) "
      "and rounds out once. Same math as vLLM / flash_attn_varlen_func with "
      "cu_seqlens_q = cu_seqlens_k; no alibi, softcap, dropout or paged KV.";
  static void check(const TensorView& out, const TensorView& lse, const TensorView& q,
                    const TensorView& k, const TensorView& v, const TensorView& cu_seqlens,
                    bool causal, double softmax_scale, int64_t window_left);
};

struct AttentionPrefillBackward {
  static constexpr const char* name = "attention_prefill_backward";
  using Signature = void(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                         const TensorView& dout, const TensorView& q, const TensorView& k,
                         const TensorView& v, const TensorView& out, const TensorView& lse,
                         const TensorView& cu_seqlens, bool causal, double softmax_scale,
                         int64_t window_left);
  static constexpr ArgSpec args[] = {{"dq", ArgRole::out},
                                     {"dk", ArgRole::out},
                                     {"dv", ArgRole::out},
                                     {"dout", ArgRole::in},
                                     {"q", ArgRole::in},
                                     {"k", ArgRole::in},
                                     {"v", ArgRole::in},
                                     {"out", ArgRole::in},
                                     {"lse", ArgRole::in},
                                     {"cu_seqlens", ArgRole::in},
                                     {"causal", ArgRole::scalar, "true"},
                                     {"softmax_scale", ArgRole::scalar, "0"},
                                     {"window_left", ArgRole::scalar, "-1"}};
  static constexpr const char* doc =
      "Backward of attention_prefill from its saved out and lse. Per sequence and query head, "
      "with p_ij = exp(scale * q_i . k_j - lse_i) over the keys i sees (Note [attention mask]) "
      "and delta_i = dout_i . out_i: dv_j = sum_i p_ij dout_i, "
      "ds_ij = p_ij (dout_i . v_j - delta_i), dq_i = scale sum_j ds_ij k_j, "
      "dk_j = scale sum_i ds_ij q_i; dk and dv of a kv head sum over the query heads that share "
      "it (GQA). Same formulas as flash-attn's backward; accumulation in f32 (f64 for f64), "
      "deterministic (no atomics).";
  static void check(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const TensorView& dout, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& out, const TensorView& lse,
                    const TensorView& cu_seqlens, bool causal, double softmax_scale,
                    int64_t window_left);
};

struct AttentionDecode {
  static constexpr const char* name = "attention_decode";
  using Signature = void(const TensorView& out, const TensorView& q, const TensorView& k_cache,
                         const TensorView& v_cache, const TensorView& seq_lens,
                         double softmax_scale);
  static constexpr ArgSpec args[] = {{"out", ArgRole::out},
                                     {"q", ArgRole::in},
                                     {"k_cache", ArgRole::in},
                                     {"v_cache", ArgRole::in},
                                     {"seq_lens", ArgRole::in},
                                     {"softmax_scale", ArgRole::scalar, "0"}};
  static constexpr const char* doc =
      "One query token per sequence against a contiguous KV cache. q: [B, Hq, D]; k_cache, "
      "v_cache: [B, max_ctx, Hkv, D], Hq a multiple of Hkv; seq_lens: int32 [B], 0 <= seq_lens[b] "
      "<= max_ctx (checked when seq_lens is on the cpu; on a CUDA device it sits beside q and the "
      "kernel clamps each length to [0, max_ctx]). out[b, h] = sum_{j < seq_lens[b]} softmax_j(scale * q[b,h] . k_cache[b,j,g]) "
      "v_cache[b,j,g] with g = h / (Hq / Hkv); scale as in attention_prefill (Note [softmax "
      "scale]). A sequence of length 0 gives out = 0. Cache rows at or past seq_lens[b] are never "
      "read. Accumulates in f32 (f64 for f64). vLLM's decode reads a paged cache through block "
      "tables; opforge's cache is one contiguous slab per sequence.";
  static void check(const TensorView& out, const TensorView& q, const TensorView& k_cache,
                    const TensorView& v_cache, const TensorView& seq_lens, double softmax_scale);
};

// The scale Note [softmax scale] gives for head_dim d.
double attention_scale(double softmax_scale, int64_t head_dim);

// Kernels (one symbol per op x backend).
void attention_prefill_reference(const Context&, const TensorView& out, const TensorView& lse,
                                 const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& cu_seqlens, bool causal, double softmax_scale,
                                 int64_t window_left);
void attention_prefill_backward_reference(const Context&, const TensorView& dq,
                                          const TensorView& dk, const TensorView& dv,
                                          const TensorView& dout, const TensorView& q,
                                          const TensorView& k, const TensorView& v,
                                          const TensorView& out, const TensorView& lse,
                                          const TensorView& cu_seqlens, bool causal,
                                          double softmax_scale, int64_t window_left);
void attention_decode_reference(const Context&, const TensorView& out, const TensorView& q,
                                const TensorView& k_cache, const TensorView& v_cache,
                                const TensorView& seq_lens, double softmax_scale);

void register_attention(Registry& reg);  // attention.cpp: ops, reference + cpu kernels, cases

}  // namespace opforge
