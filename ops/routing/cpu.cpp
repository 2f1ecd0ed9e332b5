// CPU kernel of the routing family: routing_cpu_run serves topk_softmax_cpu and grouped_topk_cpu.
//
// Assumes: the op's check has run; logits f32 / bf16 / f16 with unit-stride rows (f64 goes to
// the reference: the predicates say so); a bias, when given, is f32 / bf16 / f16.
//
// Why it is fast:
// - Per token, the E logits are widened to f32 once into an L1 buffer; the max, the exps
//   (Highway's vector Exp) and the sum of the softmax, or the sigmoid, run at full vector width
//   (4 / 8 / 16 lanes by the runtime-dispatched target).
// - Selection never sorts: one pass over the experts keeps the topk best in a small sorted array
//   (insertion; an expert that does not beat the current k-th costs one compare), so it is
//   O(E) per token for small k (E = 128, k = 8: ~130 compares). Group scores and the kept groups
//   use the same insertion. Ties follow Note [routing ties]: candidates are visited in
//   ascending id and only a strictly larger key moves ahead, as in the reference.
// - Without a bias the keys are the logits, so the softmax division is done for the k selected
//   experts only, and group scores are skipped when every group is kept (topk_softmax).
// - OpenMP over tasks of tokens, tokens per task from capacity_block (Note [tiling]); the bias is
//   widened to f32 once per task.
//
// Measured 2026-11-26 on the project's shared 2-core AVX2 machine under a load average of 12-15
// (figures several times an idle machine's): topk_softmax (128 experts, k = 8) 1.0 us per token
// on one thread (16 tokens), 4.6x the reference; 16384 tokens 108 ms (3.5x). grouped_topk
// (DeepSeek-V3: 256 experts, 8 groups, 4 kept, k = 8, sigmoid + bias) 2.4 us per token on one
// thread, 4.1x the reference; 16384 tokens 208 ms (3.7x).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/routing/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <memory>

#include "backends/cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/routing/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::routing_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// The k best (key, id) seen so far, sorted by key descending, ties by ascending id (visit ids in
// ascending order).
struct TopK {
  float* keys;
  int32_t* ids;
  int64_t k, count = 0;

  void offer(float key, int32_t id) {
    if (!(key == key)) return;  // NaN ranks nowhere
    int64_t pos;
    if (count < k) pos = count++;
    else if (key > keys[k - 1]) pos = k - 1;
    else return;
    for (; pos > 0 && key > keys[pos - 1]; --pos) {
      keys[pos] = keys[pos - 1];
      ids[pos] = ids[pos - 1];
    }
    keys[pos] = key;
    ids[pos] = id;
  }
};

// Scratch of one task: E floats for x, s, keys; the bias in f32; group scores; selections.
struct Scratch {
  std::unique_ptr<float[]> buffer;
  float *x, *s, *keys, *bias, *group_scores, *group_keys, *top_keys;
  std::unique_ptr<int32_t[]> int_buffer;
  int32_t *group_ids, *top_ids;
  bool* group_kept;
  std::unique_ptr<bool[]> kept_buffer;

  explicit Scratch(const RoutingPlan& p) {
    const int64_t E = p.experts, G = p.groups, K = p.topk;
    buffer.reset(new float[size_t(4 * E + 2 * G + K)]);
    x = buffer.get();
    s = x + E;
    keys = s + E;
    bias = keys + E;
    group_scores = bias + E;
    group_keys = group_scores + G;
    top_keys = group_keys + G;
    int_buffer.reset(new int32_t[size_t(G + K)]);
    group_ids = int_buffer.get();
    top_ids = group_ids + G;
    kept_buffer.reset(new bool[size_t(G)]);
    group_kept = kept_buffer.get();
  }
};

template <class T> void widen_row(const T* src, float* dst, int64_t n) {
  for_each_vector(n, [&](int64_t i, size_t count) { store_n(load_n(src + i, count), dst + i, count); });
}

// s = sigmoid(x), or the softmax numerators exp(x - max) with their sum returned (1 for sigmoid);
// `normalize` divides them by it here (needed when every score feeds a key).
float scores(const float* x, float* s, int64_t n, bool sigmoid, bool normalize) {
  const DF d;
  if (sigmoid) {
    const VF one = hn::Set(d, 1.0f);
    for_each_vector(n, [&](int64_t i, size_t count) {
      const VF e = hn::Exp(d, hn::Neg(load_n(x + i, count)));
      store_n(hn::Div(one, hn::Add(one, e)), s + i, count);
    });
    return 1.0f;
  }
  const int64_t lanes = int64_t(hn::Lanes(d));
  VF vm = hn::Set(d, -INFINITY);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) vm = hn::Max(vm, hn::LoadU(d, x + i));
  float max = hn::GetLane(hn::MaxOfLanes(d, vm));
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  const VF vmax = hn::Set(d, max);
  const float sum = sum_over(n, [&](int64_t i, size_t count, VF& acc) {
    VF e = hn::Exp(d, hn::Sub(load_n(x + i, count), vmax));
    if (count < hn::Lanes(d)) e = hn::IfThenElseZero(hn::FirstN(d, count), e);  // tail lanes
    store_n(e, s + i, count);
    acc = hn::Add(acc, e);
  });
  if (!normalize) return sum;
  const VF vsum = hn::Set(d, sum);
  for_each_vector(n, [&](int64_t i, size_t count) { store_n(hn::Div(load_n(s + i, count), vsum), s + i, count); });
  return 1.0f;
}

// Sum of the two largest of v[0, n).
float top2_sum(const float* v, int64_t n) {
  float first = -INFINITY, second = -INFINITY;
  for (int64_t e = 0; e < n; ++e) {
    if (v[e] > first) {
      second = first;
      first = v[e];
    } else if (v[e] > second) {
      second = v[e];
    }
  }
  return first + second;
}

void route_token(const RoutingPlan& p, Scratch& w, int64_t t) {
  const int64_t E = p.experts, G = p.groups, group_size = E / G;
  const void* row = static_cast<const char*>(p.logits) + t * p.logits_stride * dtype_size(p.dtype);
  switch (p.dtype) {
    case DType::bf16: widen_row(static_cast<const bf16_t*>(row), w.x, E); break;
    case DType::f16: widen_row(static_cast<const f16_t*>(row), w.x, E); break;
    default: widen_row(static_cast<const float*>(row), w.x, E); break;
  }
  // Without a bias only the selected scores are used: their softmax division waits until then.
  const float denominator = scores(w.x, w.s, E, p.sigmoid, p.bias != nullptr);
  const float* keys = w.x;  // Note [routing ties]: logits rank like scores
  if (p.bias) {
    for_each_vector(E, [&](int64_t i, size_t count) {
      store_n(hn::Add(load_n(w.s + i, count), load_n(w.bias + i, count)), w.keys + i, count);
    });
    keys = w.keys;
  }
  // Kept groups (all of them when topk_group == G, as in topk_softmax).
  for (int64_t g = 0; g < G; ++g) w.group_kept[g] = G == p.topk_group;
  if (G != p.topk_group) {
    for (int64_t g = 0; g < G; ++g) {
      const float* k = keys + g * group_size;
      float best = -INFINITY;
      for (int64_t e = 0; e < group_size; ++e) best = k[e] > best ? k[e] : best;
      w.group_scores[g] = p.bias ? top2_sum(k, group_size) : best;
    }
    TopK groups{w.group_keys, w.group_ids, p.topk_group};
    for (int64_t g = 0; g < G; ++g) groups.offer(w.group_scores[g], int32_t(g));
    for (int64_t j = 0; j < groups.count; ++j) w.group_kept[w.group_ids[j]] = true;
  }
  // The topk experts of the kept groups, visited in ascending id.
  TopK top{w.top_keys, w.top_ids, p.topk};
  for (int64_t g = 0; g < G; ++g) {
    if (!w.group_kept[g]) continue;
    for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) top.offer(keys[e], int32_t(e));
  }
  for (int64_t j = 0; j < top.count; ++j) w.top_keys[j] = w.s[top.ids[j]] / denominator;  // the scores
  float sum = 0;
  for (int64_t j = 0; j < top.count; ++j) sum += w.top_keys[j];
  const float scale = (p.renormalize ? 1.0f / sum : 1.0f) * float(p.scaling);
  float* weights = p.weights + t * p.weights_stride;
  int32_t* ids = p.ids + t * p.ids_stride;
  for (int64_t j = 0; j < p.topk; ++j) {
    const bool found = j < top.count;  // fewer only when keys are NaN
    ids[j] = found ? top.ids[j] : 0;
    weights[j] = found ? w.top_keys[j] * scale : 0.0f;
  }
}

void route_tokens(const RoutingPlan& p, int64_t begin, int64_t end) {
  Scratch w(p);
  if (p.bias)
    for (int64_t e = 0; e < p.experts; ++e)
      w.bias[e] = float(load_as_double(p.bias, p.bias_dtype, e * p.bias_stride));
  for (int64_t t = begin; t < end; ++t) route_token(p, w, t);
}

}  // namespace opforge::routing_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace routing_cpu {
HWY_EXPORT(route_tokens);
}  // namespace routing_cpu

void routing_cpu_run(const RoutingPlan& p) {
  // Note [tiling]: a task's logits plus its f32 scratch per expert fit half of a core's L2.
  cpu::TileSpec spec;
  spec.bytes_per_element = dtype_size(p.dtype) + 12;
  spec.multiplier = std::max<int64_t>(p.experts, 1);
  spec.level = cpu::CacheLevel::l2;
  const cpu::RowTasks tasks = cpu::balanced(cpu::row_blocks(p.tokens, spec));  // Note [balanced tasks]
  auto* fn = HWY_DYNAMIC_DISPATCH(routing_cpu::route_tokens);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { fn(p, tasks.begin(t), tasks.end(t)); });
}

const char* routing_cpu_dtype_reason(const TensorView& logits) {
  if (!logits.device.is_cpu()) return "tensors are not on the cpu";
  switch (logits.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

}  // namespace opforge
#endif  // HWY_ONCE
