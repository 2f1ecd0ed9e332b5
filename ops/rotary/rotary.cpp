// Rotary family: checks, plans, shape functions, cost models and registration (rotary.h).
#include <algorithm>
#include <string>
#include <utility>

#include "opforge/checks.h"
#include "opforge/error.h"
#include "ops/rotary/internal.h"

namespace opforge {

namespace {

// A 2-D [T, n * head_size] tensor of the cache's dtype with unit-stride rows (padding allowed).
void check_heads_tensor(const char* op, const char* arg, const TensorView& t, int64_t tokens,
                        int64_t head_size, const TensorView& cache) {
  expect_defined(op, arg, t);
  expect_floating(op, arg, t);
  if (t.ndim != 2)
    throw_argument_error(op, arg, "2 dims [tokens, heads * head_size]", t.shape_of().str());
  expect_rows_uniform(op, arg, t);
  if (t.size(0) != tokens)
    throw_argument_error(op, arg, std::to_string(tokens) + " rows (the size of 'positions')",
                         t.shape_of().str());
  if (t.size(1) % head_size != 0)
    throw_argument_error(op, arg, "a last dim that is a multiple of head_size " + std::to_string(head_size),
                         t.shape_of().str());
  expect_same_dtype(op, "cos_sin_cache", cache, arg, t);
  expect_same_device(op, arg, t, "cos_sin_cache", cache);
}

// The shared check of rotary_embedding and its backward (q / k named by the op).
void check_rotary_embedding(const char* op, const char* q_arg, const char* k_arg,
                            const TensorView& positions, const TensorView& query,
                            const TensorView& key, const TensorView& cache, int64_t head_size) {
  expect_defined(op, "positions", positions);
  expect_dtype(op, "positions", positions, DType::i64);
  if (positions.ndim != 1) throw_argument_error(op, "positions", "1 dim [tokens]", positions.shape_of().str());
  expect_defined(op, "cos_sin_cache", cache);
  expect_floating(op, "cos_sin_cache", cache);
  if (cache.ndim != 2)
    throw_argument_error(op, "cos_sin_cache", "2 dims [max_position, rotary_dim]", cache.shape_of().str());
  expect_rows_uniform(op, "cos_sin_cache", cache);
  if (head_size <= 0) throw_argument_error(op, "head_size", "a positive size", std::to_string(head_size));
  const int64_t rotary_dim = cache.size(1);
  if (rotary_dim <= 0 || rotary_dim % 2 != 0)
    throw_argument_error(op, "cos_sin_cache", "an even, positive rotary_dim (last dim)", cache.shape_of().str());
  if (rotary_dim > head_size)
    throw_argument_error(op, "cos_sin_cache",
                         "rotary_dim (last dim) <= head_size " + std::to_string(head_size),
                         cache.shape_of().str());
  const int64_t tokens = positions.size(0);
  check_heads_tensor(op, q_arg, query, tokens, head_size, cache);
  check_heads_tensor(op, k_arg, key, tokens, head_size, cache);
  expect_same_device(op, "positions", positions, "cos_sin_cache", cache);
  expect_no_overlap(op, q_arg, query, k_arg, key);
  expect_no_overlap(op, q_arg, query, "positions", positions);
  expect_no_overlap(op, q_arg, query, "cos_sin_cache", cache);
  expect_no_overlap(op, k_arg, key, "positions", positions);
  expect_no_overlap(op, k_arg, key, "cos_sin_cache", cache);
  // Positions index the cache: checked here where the values are readable without a copy.
  if (positions.device.is_cpu()) {
    const int64_t max_pos = cache.size(0);
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t p = static_cast<const int64_t*>(positions.data)[t * positions.stride(0)];
      if (p < 0 || p >= max_pos)
        throw_argument_error(op, "positions",
                             "values in [0, " + std::to_string(max_pos) + ") (rows of 'cos_sin_cache')",
                             std::to_string(p) + " at index " + std::to_string(t));
    }
  }
}

// x / dy: [T, heads, head_size]; cos / sin: [T, r/2]; y / dx like x, exact alias allowed.
void check_apply_rotary(const char* op, const char* out_arg, const char* in_arg,
                        const TensorView& out, const TensorView& x, const TensorView& cos,
                        const TensorView& sin) {
  expect_defined(op, in_arg, x);
  expect_floating(op, in_arg, x);
  if (x.ndim != 3) throw_argument_error(op, in_arg, "3 dims [tokens, heads, head_size]", x.shape_of().str());
  expect_rows_uniform(op, in_arg, x);
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"cos", &cos}, {"sin", &sin}}) {
    expect_defined(op, arg, *t);
    expect_same_dtype(op, arg, *t, in_arg, x);
    if (t->ndim != 2 || t->size(0) != x.size(0))
      throw_argument_error(op, arg, "[" + std::to_string(x.size(0)) + ", rotary_dim / 2]", t->shape_of().str());
    expect_rows_uniform(op, arg, *t);
    expect_same_device(op, arg, *t, in_arg, x);
  }
  const int64_t half = cos.size(1);
  if (half <= 0 || 2 * half > x.size(2))
    throw_argument_error(op, "cos", "a last dim in [1, head_size / 2] (head_size " + std::to_string(x.size(2)) + ")",
                         cos.shape_of().str());
  expect_same_shape(op, "sin", sin, "cos", cos);
  expect_defined(op, out_arg, out);
  expect_same_dtype(op, out_arg, out, in_arg, x);
  expect_same_shape(op, out_arg, out, in_arg, x);
  expect_rows_uniform(op, out_arg, out);
  expect_same_device(op, out_arg, out, in_arg, x);
  expect_no_overlap(op, out_arg, out, in_arg, x, Aliasing::exact);
  expect_no_overlap(op, out_arg, out, "cos", cos);
  expect_no_overlap(op, out_arg, out, "sin", sin);
}

RotaryPart heads_part(const TensorView& src, const TensorView& dst, int64_t n_heads,
                      int64_t head_stride_src, int64_t head_stride_dst) {
  RotaryPart part;
  part.src = src.data;
  part.dst = dst.data;
  part.n_heads = n_heads;
  part.src_token_stride = src.stride(0);
  part.src_head_stride = head_stride_src;
  part.dst_token_stride = dst.stride(0);
  part.dst_head_stride = head_stride_dst;
  return part;
}

}  // namespace

void RotaryEmbedding::check(const TensorView& positions, const TensorView& query,
                            const TensorView& key, const TensorView& cos_sin_cache,
                            int64_t head_size, bool) {
  check_rotary_embedding(name, "query", "key", positions, query, key, cos_sin_cache, head_size);
}

void RotaryEmbeddingBackward::check(const TensorView& positions, const TensorView& dquery,
                                    const TensorView& dkey, const TensorView& cos_sin_cache,
                                    int64_t head_size, bool) {
  check_rotary_embedding(name, "dquery", "dkey", positions, dquery, dkey, cos_sin_cache, head_size);
}

void ApplyRotaryEmb::check(const TensorView& y, const TensorView& x, const TensorView& cos,
                           const TensorView& sin, bool) {
  check_apply_rotary(name, "y", "x", y, x, cos, sin);
}

void ApplyRotaryEmbBackward::check(const TensorView& dx, const TensorView& dy,
                                   const TensorView& cos, const TensorView& sin, bool) {
  check_apply_rotary(name, "dx", "dy", dx, dy, cos, sin);
}

RotaryPlan rotary_embedding_plan(const TensorView& positions, const TensorView& query,
                                 const TensorView& key, const TensorView& cache, int64_t head_size,
                                 bool is_neox, double sin_sign) {
  RotaryPlan p;
  p.dtype = query.dtype;
  p.neox = is_neox;
  p.sin_sign = sin_sign;
  p.tokens = positions.size(0);
  p.head_size = head_size;
  p.half = cache.size(1) / 2;
  p.positions = static_cast<const int64_t*>(positions.data);
  p.cos = cache.data;
  p.sin = static_cast<const char*>(cache.data) + p.half * cache.itemsize();
  p.cos_stride = p.sin_stride = cache.stride(0);
  p.parts[0] = heads_part(query, query, query.size(1) / head_size, head_size, head_size);
  p.parts[1] = heads_part(key, key, key.size(1) / head_size, head_size, head_size);
  p.n_parts = 2;
  return p;
}

RotaryPlan apply_rotary_plan(const TensorView& y, const TensorView& x, const TensorView& cos,
                             const TensorView& sin, bool is_neox, double sin_sign) {
  RotaryPlan p;
  p.dtype = x.dtype;
  p.neox = is_neox;
  p.sin_sign = sin_sign;
  p.tokens = x.size(0);
  p.head_size = x.size(2);
  p.half = cos.size(1);
  p.cos = cos.data;
  p.sin = sin.data;
  p.cos_stride = cos.stride(0);
  p.sin_stride = sin.stride(0);
  p.parts[0] = heads_part(x, y, x.size(1), x.stride(1), y.stride(1));
  p.n_parts = 1;
  return p;
}

namespace {

// Positions (1-D contiguous in every case the plan is built for).
const char* positions_layout_reason(const TensorView& positions) {
  return positions.ndim == 1 && positions.size(0) > 1 && positions.stride(0) != 1
             ? "positions are not contiguous"
             : nullptr;
}

void rotary_embedding_reference(const Context&, const TensorView& positions, const TensorView& query,
                                const TensorView& key, const TensorView& cache, int64_t head_size,
                                bool is_neox) {
  rotary_reference_run(rotary_embedding_plan(positions, query, key, cache, head_size, is_neox, 1.0));
}
void rotary_embedding_backward_reference(const Context&, const TensorView& positions,
                                         const TensorView& dquery, const TensorView& dkey,
                                         const TensorView& cache, int64_t head_size, bool is_neox) {
  rotary_reference_run(rotary_embedding_plan(positions, dquery, dkey, cache, head_size, is_neox, -1.0));
}
void rotary_embedding_cpu(const Context&, const TensorView& positions, const TensorView& query,
                          const TensorView& key, const TensorView& cache, int64_t head_size,
                          bool is_neox) {
  rotary_cpu_run(rotary_embedding_plan(positions, query, key, cache, head_size, is_neox, 1.0));
}
void rotary_embedding_backward_cpu(const Context&, const TensorView& positions,
                                   const TensorView& dquery, const TensorView& dkey,
                                   const TensorView& cache, int64_t head_size, bool is_neox) {
  rotary_cpu_run(rotary_embedding_plan(positions, dquery, dkey, cache, head_size, is_neox, -1.0));
}
const char* rotary_embedding_cpu_applicable(const TensorView& positions, const TensorView& query,
                                            const TensorView&, const TensorView&, int64_t, bool) {
  if (const char* why = rotary_cpu_dtype_reason(query)) return why;
  return positions_layout_reason(positions);
}

void apply_rotary_emb_reference(const Context&, const TensorView& y, const TensorView& x,
                                const TensorView& cos, const TensorView& sin, bool is_neox) {
  rotary_reference_run(apply_rotary_plan(y, x, cos, sin, is_neox, 1.0));
}
void apply_rotary_emb_backward_reference(const Context&, const TensorView& dx, const TensorView& dy,
                                         const TensorView& cos, const TensorView& sin, bool is_neox) {
  rotary_reference_run(apply_rotary_plan(dx, dy, cos, sin, is_neox, -1.0));
}
void apply_rotary_emb_cpu(const Context&, const TensorView& y, const TensorView& x,
                          const TensorView& cos, const TensorView& sin, bool is_neox) {
  rotary_cpu_run(apply_rotary_plan(y, x, cos, sin, is_neox, 1.0));
}
void apply_rotary_emb_backward_cpu(const Context&, const TensorView& dx, const TensorView& dy,
                                   const TensorView& cos, const TensorView& sin, bool is_neox) {
  rotary_cpu_run(apply_rotary_plan(dx, dy, cos, sin, is_neox, -1.0));
}
const char* apply_rotary_emb_cpu_applicable(const TensorView&, const TensorView& x,
                                            const TensorView&, const TensorView&, bool) {
  return rotary_cpu_dtype_reason(x);
}

// Flops per rotated pair: 4 multiplies, 2 adds.
constexpr double kPairFlops = 6;

// In place: query and key read and written once; positions and one cache row per token read.
Cost rotary_embedding_cost(const ArgList& a, const char* q_arg, const char* k_arg) {
  const TensorView &q = a.tensor(q_arg), &k = a.tensor(k_arg), &cache = a.tensor("cos_sin_cache");
  const double tokens = double(q.size(0));
  const double rows_read = std::min(tokens, double(cache.size(0)));
  const double heads = double(q.size(1) + k.size(1)) / double(a.i64("head_size"));
  return Cost{2 * (bytes_of(q) + bytes_of(k)) + bytes_of(a.tensor("positions")) +
                  rows_read * double(cache.size(1) * cache.itemsize()),
              kPairFlops * tokens * heads * double(cache.size(1) / 2)};
}

Cost apply_rotary_cost(const ArgList& a, const char* in_arg) {
  const TensorView &x = a.tensor(in_arg), &cos = a.tensor("cos");
  return Cost{2 * bytes_of(x) + 2 * bytes_of(cos),
              kPairFlops * double(x.size(0) * x.size(1)) * double(cos.size(1))};
}

KernelDesc reference_desc(bool in_place) {
  return reference_kernel_desc("plain loops, double math, one rounding per output", in_place);
}
KernelDesc cpu_desc(bool in_place) {
  return cpu_kernel_desc("Highway SIMD (runtime ISA dispatch) + OpenMP over token tasks, f32 math",
                         in_place);
}

template <class Op>
void register_rotary_embedding_op(Registry& reg, const char* q_arg, const char* k_arg,
                                  std::vector<Case> (*cases)(), typename OpTraits<Op>::Kernel* ref,
                                  typename OpTraits<Op>::Kernel* cpu) {
  OpEntry& op = reg.add_op<Op>();
  op.outputs = [](const ArgList&) { return std::vector<OutputSpec>{}; };  // in place
  op.cost = [q_arg, k_arg](const ArgList& a) { return rotary_embedding_cost(a, q_arg, k_arg); };
  op.cases = cases;
  reg.add_kernel<Op>(reference_desc(false), ref);
  reg.add_kernel<Op>(cpu_desc(false), cpu, &rotary_embedding_cpu_applicable);
}

template <class Op>
void register_apply_rotary_op(Registry& reg, const char* out_arg, const char* in_arg,
                              std::vector<Case> (*cases)(), typename OpTraits<Op>::Kernel* ref,
                              typename OpTraits<Op>::Kernel* cpu) {
  OpEntry& op = reg.add_op<Op>();
  op.outputs = [out_arg, in_arg](const ArgList& a) {
    const TensorView& x = a.tensor(in_arg);
    return std::vector<OutputSpec>{{out_arg, x.shape_of(), x.dtype}};
  };
  op.cost = [in_arg](const ArgList& a) { return apply_rotary_cost(a, in_arg); };
  op.cases = cases;
  reg.add_kernel<Op>(reference_desc(true), ref);
  reg.add_kernel<Op>(cpu_desc(true), cpu, &apply_rotary_emb_cpu_applicable);
}

}  // namespace

void register_rotary(Registry& reg) {
  register_rotary_embedding_op<RotaryEmbedding>(reg, "query", "key", rotary_embedding_cases,
                                                &rotary_embedding_reference, &rotary_embedding_cpu);
  register_rotary_embedding_op<RotaryEmbeddingBackward>(
      reg, "dquery", "dkey", rotary_embedding_backward_cases, &rotary_embedding_backward_reference,
      &rotary_embedding_backward_cpu);
  register_apply_rotary_op<ApplyRotaryEmb>(reg, "y", "x", apply_rotary_emb_cases,
                                           &apply_rotary_emb_reference, &apply_rotary_emb_cpu);
  register_apply_rotary_op<ApplyRotaryEmbBackward>(
      reg, "dx", "dy", apply_rotary_emb_backward_cases, &apply_rotary_emb_backward_reference,
      &apply_rotary_emb_backward_cpu);
}

}  // namespace opforge
