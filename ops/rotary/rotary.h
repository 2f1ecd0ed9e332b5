// Rotary family: rotary_embedding (vLLM's in-place form over a cos/sin cache), apply_rotary_emb
// (out of place, given cos and sin), and their backward ops.
//
// Greppable chain: op `rotary_embedding` -> rotary_embedding_reference (reference.cpp),
// rotary_embedding_cpu (cpu.cpp). Cases in cases.cpp, checks / shapes / costs in rotary.cpp.
//
// Note [rotary pairs]: the first rotary_dim dims of every head are split into rotary_dim / 2
// pairs (x1, x2) and each pair is rotated by its angle: o1 = x1 cos - x2 sin, o2 = x2 cos + x1 sin.
// NeoX style pairs dim i with dim i + rotary_dim / 2 (two halves); GPT-J style pairs dims 2i and
// 2i + 1 (interleaved). Pair i uses cos[i] and sin[i]. Dims from rotary_dim to head_size pass
// through unchanged. The backward of a rotation is the rotation by -angle (sin negated), which is
// its transpose for any cos and sin, so the backward ops are the forward ones with sin negated.
#pragma once

#include <cstdint>
#include <vector>

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

// A RoPE cache in vLLM's layout (base 10000): row p = [cos(p f_0 ..), sin(p f_0 ..)], f_i =
// 10000^(-2i / rotary_dim), for the harness's cases and the perf grid. Every pair's rotation
// keeps its length, so calls repeated in place on the same query and key (timing) leave their
// values where they were; a random cache would shrink or grow them call by call into
// subnormals or infinities, which run at another speed.
std::vector<double> rope_cos_sin_cache(int64_t max_pos, int64_t rotary_dim);

struct RotaryEmbedding {
  static constexpr const char* name = "rotary_embedding";
  static constexpr const char* backward = "rotary_embedding_backward";
  using Signature = void(const TensorView& positions, const TensorView& query,
                         const TensorView& key, const TensorView& cos_sin_cache,
                         int64_t head_size, bool is_neox);
  static constexpr ArgSpec args[] = {{"positions", ArgRole::in},
                                     {"query", ArgRole::inout},
                                     {"key", ArgRole::inout},
                                     {"cos_sin_cache", ArgRole::in},
                                     {"head_size", ArgRole::scalar, "128"},
                                     {"is_neox", ArgRole::scalar, "true"}};
  static constexpr const char* doc =
      "vLLM's rotary_embedding, in place. positions: i64 [T], each in [0, max_pos); query: "
      "[T, n_q * head_size], key: [T, n_kv * head_size] (any head counts, GQA included; rows "
      "may be padded); cos_sin_cache: [max_pos, rotary_dim] of query's dtype, cos in the first "
      "rotary_dim / 2 columns and sin in the rest. For token t, cos = cache[positions[t], :r/2], "
      "sin = cache[positions[t], r/2:], and every head of query and key is rotated by Note "
      "[rotary pairs] (is_neox: halves; else GPT-J interleaved pairs); dims past rotary_dim "
      "(<= head_size, even) are untouched. Computed in f32 (f64 for f64), rounded once. Differs "
      "from vLLM: key is required, positions are 1-D, and the cache has query's dtype.";
  static void check(const TensorView& positions, const TensorView& query, const TensorView& key,
                    const TensorView& cos_sin_cache, int64_t head_size, bool is_neox);
};

struct RotaryEmbeddingBackward {
  static constexpr const char* name = "rotary_embedding_backward";
  using Signature = void(const TensorView& positions, const TensorView& dquery,
                         const TensorView& dkey, const TensorView& cos_sin_cache,
                         int64_t head_size, bool is_neox);
  static constexpr ArgSpec args[] = {{"positions", ArgRole::in},
                                     {"dquery", ArgRole::inout},
                                     {"dkey", ArgRole::inout},
                                     {"cos_sin_cache", ArgRole::in},
                                     {"head_size", ArgRole::scalar, "128"},
                                     {"is_neox", ArgRole::scalar, "true"}};
  static constexpr const char* doc =
      "Backward of rotary_embedding, in place: dquery and dkey hold the gradients of the rotated "
      "query and key on entry and those of the inputs on return, i.e. they are rotated by the "
      "negated angles (Note [rotary pairs]). Same arguments and checks as the forward.";
  static void check(const TensorView& positions, const TensorView& dquery, const TensorView& dkey,
                    const TensorView& cos_sin_cache, int64_t head_size, bool is_neox);
};

struct ApplyRotaryEmb {
  static constexpr const char* name = "apply_rotary_emb";
  static constexpr const char* backward = "apply_rotary_emb_backward";
  using Signature = void(const TensorView& y, const TensorView& x, const TensorView& cos,
                         const TensorView& sin, bool is_neox);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out},
                                     {"x", ArgRole::in},
                                     {"cos", ArgRole::in},
                                     {"sin", ArgRole::in},
                                     {"is_neox", ArgRole::scalar, "true"}};
  static constexpr const char* doc =
      "vLLM's ApplyRotaryEmb on given cos and sin. x, y: [T, heads, head_size]; cos, sin: "
      "[T, r/2] of x's dtype with rotary_dim r = 2 * cos.size(-1) <= head_size. Every head of "
      "token t is rotated by cos[t], sin[t] per Note [rotary pairs] (is_neox: halves; else "
      "interleaved); dims past r are copied. Computed in f32 (f64 for f64) and rounded once, "
      "i.e. vLLM's enable_fp32_compute=True. y may alias x exactly (in place).";
  static void check(const TensorView& y, const TensorView& x, const TensorView& cos,
                    const TensorView& sin, bool is_neox);
};

struct ApplyRotaryEmbBackward {
  static constexpr const char* name = "apply_rotary_emb_backward";
  using Signature = void(const TensorView& dx, const TensorView& dy, const TensorView& cos,
                         const TensorView& sin, bool is_neox);
  static constexpr ArgSpec args[] = {{"dx", ArgRole::out},
                                     {"dy", ArgRole::in},
                                     {"cos", ArgRole::in},
                                     {"sin", ArgRole::in},
                                     {"is_neox", ArgRole::scalar, "true"}};
  static constexpr const char* doc =
      "Backward of apply_rotary_emb: dx = dy rotated by the negated angles (Note [rotary pairs]); "
      "dims past rotary_dim are copied. dx may alias dy exactly.";
  static void check(const TensorView& dx, const TensorView& dy, const TensorView& cos,
                    const TensorView& sin, bool is_neox);
};

void register_rotary(Registry& reg);  // rotary.cpp: ops, reference + cpu kernels, cases

}  // namespace opforge
