// Attention family internals shared by attention.cpp, reference.cpp, cpu*.cpp and cases.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"
#include "ops/attention/attention.h"

namespace opforge {

// Values of an int32 / int64 1-D tensor (cu_seqlens, seq_lens) as int64.
std::vector<int64_t> index_values(const TensorView& t);

// Key range [lo, hi) that query position i of a sequence of n tokens sees (Note [attention mask]).
inline int64_t attention_key_begin(int64_t i, int64_t window_left) {
  return window_left < 0 ? 0 : (i - window_left > 0 ? i - window_left : 0);
}
inline int64_t attention_key_end(int64_t i, int64_t n, bool causal) { return causal ? i + 1 : n; }

// Number of (query, key) pairs a sequence of n tokens scores under Note [attention mask].
int64_t attention_pairs(int64_t n, bool causal, int64_t window_left);

// ---- cpu.cpp / cpu_backward.cpp -----------------------------------------------------------------
void attention_prefill_cpu(const Context&, const TensorView& out, const TensorView& lse,
                           const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& cu_seqlens, bool causal, double softmax_scale,
                           int64_t window_left);
void attention_decode_cpu(const Context&, const TensorView& out, const TensorView& q,
                          const TensorView& k_cache, const TensorView& v_cache,
                          const TensorView& seq_lens, double softmax_scale);
void attention_prefill_backward_cpu(const Context&, const TensorView& dq, const TensorView& dk,
                                    const TensorView& dv, const TensorView& dout,
                                    const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse,
                                    const TensorView& cu_seqlens, bool causal,
                                    double softmax_scale, int64_t window_left);

const char* attention_prefill_cpu_applicable(const TensorView& out, const TensorView& lse,
                                             const TensorView& q, const TensorView& k,
                                             const TensorView& v, const TensorView& cu_seqlens,
                                             bool causal, double softmax_scale,
                                             int64_t window_left);
const char* attention_decode_cpu_applicable(const TensorView& out, const TensorView& q,
                                            const TensorView& k_cache, const TensorView& v_cache,
                                            const TensorView& seq_lens, double softmax_scale);
const char* attention_prefill_backward_cpu_applicable(
    const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
    const TensorView& lse, const TensorView& cu_seqlens, bool causal, double softmax_scale,
    int64_t window_left);

// ---- cases.cpp ----------------------------------------------------------------------------------
std::vector<Case> attention_prefill_cases();
std::vector<Case> attention_prefill_backward_cases();
std::vector<Case> attention_decode_cases();

// ---- what the per-target cpu code receives (plain data; strides in elements) --------------------
// Rows of q / out / k / v are addressed as base + row * stride (Note [attention layout]).
struct AttentionRows {
  DType dtype = DType::f32;
  int64_t head_dim = 0;
  int64_t group = 1;  // query heads per kv head
  int64_t q_heads = 0, kv_heads = 0;
  float scale = 1;
  const void* q = nullptr;
  int64_t q_stride = 0;
  const void* k = nullptr;
  int64_t k_stride = 0;
  const void* v = nullptr;
  int64_t v_stride = 0;
  void* out = nullptr;  // forward out, or dq in the backward's dq pass
  int64_t out_stride = 0;
  float* lse = nullptr;  // forward: [Hq, T] output; backward: input
  int64_t tokens = 0;    // T: the lse row length
  // backward only
  const void* dout = nullptr;
  int64_t dout_stride = 0;
  const float* delta = nullptr;  // [Hq, T]: dout . out per query row
  void* dk = nullptr;
  int64_t dk_stride = 0;
  void* dv = nullptr;
  int64_t dv_stride = 0;
};

// One task: kv head `kv_head` of one sequence, query positions [q_begin, q_end) (forward, dq) or
// key positions [k_begin, k_end) (dk / dv). Positions are inside the sequence.
//   token row of query position i:  q_row0 + i * q_heads (+ head)
//   token row of key position j:    k_row0 + j * kv_heads (+ kv_head); keys at k_pos_stride apart
struct AttentionTask {
  int64_t q_token0 = 0;   // token index of position 0 of the sequence's queries (rows of q, out)
  int64_t k_token0 = 0;   // token index of position 0 of the sequence's keys (rows of k, v)
  int64_t lse_token0 = -1;  // lse column of position 0, or -1: no lse (decode)
  int64_t n_keys = 0;
  int64_t kv_head = 0;
  int64_t kv_head_end = 0;  // decode: kv heads [kv_head, kv_head_end) in one task
  int64_t begin = 0, end = 0;  // query (or key) positions of the task
  bool causal = true;
  int64_t window_left = -1;
  int64_t key_block = 1;  // keys per tile (Note [tiling])
};

// ---- cpu.cpp: what the cpu drivers (cpu.cpp, cpu_backward.cpp) share -------------------------
// Fields of AttentionRows common to every kernel: dtype, sizes, scale, q / k / v.
AttentionRows attention_rows_of(const TensorView& q, const TensorView& k, const TensorView& v,
                                double softmax_scale);
// Note [tiling]: units of `tensors` f32 rows of head_dim that fit the given cache level.
int64_t attention_block(int64_t tensors, int64_t head_dim, cpu::CacheLevel level);
// Keys per K/V tile of the forward and dq tasks.
int64_t attention_key_tile(int64_t head_dim);
// Tasks over (sequence, kv head, block of `block` positions) of a packed batch.
std::vector<AttentionTask> attention_prefill_tasks(const std::vector<int64_t>& cu, int64_t kv_heads,
                                                   int64_t block, int64_t key_block, bool causal,
                                                   int64_t window_left);
// nullptr when the cpu kernels take q's dtype and device, else why not.
const char* attention_cpu_dtype_reason(const TensorView& q);

template <class Fn>
void run_attention_tasks(const std::vector<AttentionTask>& tasks, const AttentionRows& a, Fn* fn) {
  cpu::parallel_tasks(int64_t(tasks.size()), [&](int64_t i) { fn(a, tasks[size_t(i)]); });
}

}  // namespace opforge
