// MoE data movement of the routing family: moe_permute and moe_unpermute (routing.h) — checks,
// shape functions, costs, the reference and cpu kernels, cases and registration.
//
// reference: plain loops; permute copies element by element through double (every dtype incl.
// f64), unpermute accumulates in double in the order j = 0..k-1.
// cpu (f32 / bf16 / f16):
//  - permute: one serial pass over the T * k ids counts the experts, a prefix sum gives
//    expert_offsets, a second pass hands each pair the next row of its expert (stable: pairs are
//    visited in increasing p) and writes inv_perm; O(T * k + E) integer work, small next to the
//    row copies (2048 to 8192 bytes per pair for the models of the cases). The rows (the bulk of
//    the bytes) are then copied by OpenMP tasks of output rows in order (each gathers its
//    token's x row; stores stay sequential), rows per task from capacity_block (Note [tiling]): a
//    pure copy, by memcpy or, past the cache share, by non-temporal stores with the next row
//    prefetched (cpu::gather_rows, Note [row gather]).
//  - unpermute: Highway SIMD + OpenMP over tokens, f32 accumulation (cpu_moe.cpp).
//
// Measured 2026-11-26 (bf16, large group) on the project's shared 2-core machine under load
// (other builds running; one OpenMP thread was faster than two): permute 38-49% of the copy
// ceiling at 1024-16384 tokens, 16-22x the reference; unpermute 56% in cache (1-16 tokens), 24-28%
// at 1024-16384 tokens (rows gathered at random from 33-268 MB), 12-18x the reference.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/gather.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"
#include "opforge/checks.h"
#include "opforge/error.h"
#include "ops/routing/internal.h"

namespace opforge {

namespace {

int64_t id_at(const TensorView& t, int64_t i) {
  return t.dtype == DType::i32 ? int64_t(static_cast<const int32_t*>(t.data)[i])
                               : static_cast<const int64_t*>(t.data)[i];
}

void expect_index_vector(const char* op, const char* arg, const TensorView& t, int64_t n) {
  expect_defined(op, arg, t);
  if (t.dtype != DType::i32 && t.dtype != DType::i64)
    throw_argument_error(op, arg, "dtype int32 or int64", dtype_name(t.dtype));
  expect_shape(op, arg, t, Shape{n});
  if (!t.is_contiguous()) throw_argument_error(op, arg, "a contiguous tensor", t.str());
}

void expect_rows(const char* op, const char* arg, const TensorView& t, const Shape& shape,
                 const char* ref_arg, const TensorView& ref) {
  expect_defined(op, arg, t);
  expect_same_dtype(op, arg, t, ref_arg, ref);
  expect_shape(op, arg, t, shape);
  expect_rows_uniform(op, arg, t);
  expect_same_device(op, arg, t, ref_arg, ref);
}

int64_t stride_of(const TensorView& t) { return t.rows() > 1 ? t.row_stride() : 0; }

}  // namespace

void MoePermute::check(const TensorView& permuted, const TensorView& offsets,
                       const TensorView& inv_perm, const TensorView& x, const TensorView& ids,
                       int64_t num_experts) {
  expect_row_tensor(name, "x", x);
  if (x.ndim != 2) throw_argument_error(name, "x", "2 dims [tokens, hidden]", x.shape_of().str());
  const int64_t tokens = x.size(0), hidden = x.size(1);
  expect_defined(name, "topk_ids", ids);
  expect_dtype(name, "topk_ids", ids, DType::i32);
  if (ids.ndim != 2 || ids.size(0) != tokens || ids.size(1) < 1)
    throw_argument_error(name, "topk_ids", "[" + std::to_string(tokens) + ", k] with k >= 1",
                         ids.shape_of().str());
  if (!ids.is_contiguous()) throw_argument_error(name, "topk_ids", "a contiguous tensor", ids.str());
  expect_same_device(name, "topk_ids", ids, "x", x);
  const int64_t pairs = tokens * ids.size(1);
  if (num_experts < 1 || num_experts > INT32_MAX)
    throw_argument_error(name, "num_experts", "a value in [1, 2^31)", std::to_string(num_experts));
  for (int64_t i = 0; ids.device.is_cpu() && i < pairs; ++i) {
    const int64_t id = id_at(ids, i);
    if (id < 0 || id >= num_experts)
      throw_argument_error(name, "topk_ids", "values in [0, " + std::to_string(num_experts) + ")",
                           std::to_string(id) + " at index " + std::to_string(i));
  }
  expect_rows(name, "permuted", permuted, Shape{pairs, hidden}, "x", x);
  expect_defined(name, "expert_offsets", offsets);
  expect_dtype(name, "expert_offsets", offsets, DType::i64);
  expect_shape(name, "expert_offsets", offsets, Shape{num_experts + 1});
  if (!offsets.is_contiguous())
    throw_argument_error(name, "expert_offsets", "a contiguous tensor", offsets.str());
  expect_same_device(name, "expert_offsets", offsets, "x", x);
  expect_index_vector(name, "inv_perm", inv_perm, pairs);
  if (inv_perm.dtype == DType::i32 && pairs > INT32_MAX)
    throw_argument_error(name, "inv_perm", "int64 for more than 2^31 - 1 pairs", "int32");
  expect_same_device(name, "inv_perm", inv_perm, "x", x);
  const std::pair<const char*, const TensorView*> outs[] = {
      {"permuted", &permuted}, {"expert_offsets", &offsets}, {"inv_perm", &inv_perm}};
  for (size_t i = 0; i < 3; ++i) {
    expect_no_overlap(name, outs[i].first, *outs[i].second, "x", x);
    expect_no_overlap(name, outs[i].first, *outs[i].second, "topk_ids", ids);
    for (size_t j = i + 1; j < 3; ++j)
      expect_no_overlap(name, outs[j].first, *outs[j].second, outs[i].first, *outs[i].second);
  }
}

void MoeUnpermute::check(const TensorView& y, const TensorView& expert_out,
                         const TensorView& inv_perm, const TensorView& weights) {
  expect_defined(name, "topk_weights", weights);
  expect_dtype(name, "topk_weights", weights, DType::f32);
  if (weights.ndim != 2 || weights.size(1) < 1)
    throw_argument_error(name, "topk_weights", "2 dims [tokens, k] with k >= 1", weights.shape_of().str());
  if (!weights.is_contiguous())
    throw_argument_error(name, "topk_weights", "a contiguous tensor", weights.str());
  const int64_t tokens = weights.size(0), pairs = tokens * weights.size(1);
  expect_row_tensor(name, "expert_out", expert_out);
  if (expert_out.ndim != 2 || expert_out.size(0) != pairs)
    throw_argument_error(name, "expert_out", "[" + std::to_string(pairs) + ", hidden] (tokens * k rows)",
                         expert_out.shape_of().str());
  expect_same_device(name, "expert_out", expert_out, "topk_weights", weights);
  expect_index_vector(name, "inv_perm", inv_perm, pairs);
  expect_same_device(name, "inv_perm", inv_perm, "topk_weights", weights);
  for (int64_t i = 0; inv_perm.device.is_cpu() && i < pairs; ++i) {
    const int64_t r = id_at(inv_perm, i);
    if (r < 0 || r >= pairs)
      throw_argument_error(name, "inv_perm", "values in [0, " + std::to_string(pairs) + ")",
                           std::to_string(r) + " at index " + std::to_string(i));
  }
  expect_rows(name, "y", y, Shape{tokens, expert_out.size(1)}, "expert_out", expert_out);
  expect_no_overlap(name, "y", y, "expert_out", expert_out);
  expect_no_overlap(name, "y", y, "inv_perm", inv_perm);
  expect_no_overlap(name, "y", y, "topk_weights", weights);
}

MoePermutePlan moe_permute_plan(const TensorView& permuted, const TensorView& offsets,
                                const TensorView& inv_perm, const TensorView& x,
                                const TensorView& ids, int64_t num_experts) {
  MoePermutePlan p;
  p.dtype = x.dtype;
  p.x = x.data;
  p.x_stride = stride_of(x);
  p.tokens = x.size(0);
  p.hidden = x.size(1);
  p.topk = ids.size(1);
  p.experts = num_experts;
  p.ids = static_cast<const int32_t*>(ids.data);
  p.out = permuted.data;
  p.out_stride = stride_of(permuted);
  p.offsets = static_cast<int64_t*>(offsets.data);
  p.inv = inv_perm.data;
  p.inv_i64 = inv_perm.dtype == DType::i64;
  return p;
}

MoeUnpermutePlan moe_unpermute_plan(const TensorView& y, const TensorView& expert_out,
                                    const TensorView& inv_perm, const TensorView& weights) {
  MoeUnpermutePlan p;
  p.dtype = expert_out.dtype;
  p.in = expert_out.data;
  p.in_stride = stride_of(expert_out);
  p.tokens = weights.size(0);
  p.topk = weights.size(1);
  p.hidden = expert_out.size(1);
  p.inv = inv_perm.data;
  p.inv_i64 = inv_perm.dtype == DType::i64;
  p.weights = static_cast<const float*>(weights.data);
  p.y = y.data;
  p.y_stride = stride_of(y);
  return p;
}

namespace {

int64_t inv_at(const void* inv, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(inv)[i] : int64_t(static_cast<const int32_t*>(inv)[i]);
}
void set_inv(void* inv, bool i64, int64_t i, int64_t v) {
  if (i64) static_cast<int64_t*>(inv)[i] = v;
  else static_cast<int32_t*>(inv)[i] = int32_t(v);
}

// Counts, offsets and inv_perm (Note [moe permutation]); shared by both host kernels.
void permute_positions(const MoePermutePlan& p) {
  const int64_t pairs = p.tokens * p.topk;
  std::vector<int64_t> cursor(size_t(p.experts), 0);
  for (int64_t i = 0; i < pairs; ++i) ++cursor[size_t(p.ids[i])];
  int64_t sum = 0;
  for (int64_t e = 0; e < p.experts; ++e) {
    p.offsets[e] = sum;
    sum += cursor[size_t(e)];
    cursor[size_t(e)] = p.offsets[e];
  }
  p.offsets[p.experts] = sum;
  for (int64_t i = 0; i < pairs; ++i) set_inv(p.inv, p.inv_i64, i, cursor[size_t(p.ids[i])]++);
}

void moe_permute_reference(const Context&, const TensorView& permuted, const TensorView& offsets,
                           const TensorView& inv_perm, const TensorView& x, const TensorView& ids,
                           int64_t num_experts) {
  const MoePermutePlan p = moe_permute_plan(permuted, offsets, inv_perm, x, ids, num_experts);
  permute_positions(p);
  for (int64_t i = 0; i < p.tokens * p.topk; ++i) {
    const int64_t row = inv_at(p.inv, p.inv_i64, i), t = i / p.topk;
    for (int64_t h = 0; h < p.hidden; ++h)
      store_from_double(p.out, p.dtype, row * p.out_stride + h,
                        load_as_double(p.x, p.dtype, t * p.x_stride + h));
  }
}

void moe_permute_cpu(const Context&, const TensorView& permuted, const TensorView& offsets,
                     const TensorView& inv_perm, const TensorView& x, const TensorView& ids,
                     int64_t num_experts) {
  const MoePermutePlan p = moe_permute_plan(permuted, offsets, inv_perm, x, ids, num_experts);
  permute_positions(p);
  const int64_t pairs = p.tokens * p.topk, size = dtype_size(p.dtype);
  const size_t row_bytes = size_t(p.hidden * size);
  if (row_bytes == 0) return;
  // The token of each output row, so that rows are written in order (sequential stores).
  std::unique_ptr<int64_t[]> token_of(new int64_t[size_t(pairs)]);
  for (int64_t i = 0; i < pairs; ++i) token_of[inv_at(p.inv, p.inv_i64, i)] = i / p.topk;
  // Note [tiling]: a task's rows (read + written) fill half of a core's L2.
  cpu::TileSpec spec;
  spec.bytes_per_element = 2 * size;
  spec.multiplier = p.hidden;
  const cpu::RowTasks tasks = cpu::balanced(cpu::row_blocks(pairs, spec));  // Note [balanced tasks]
  const cpu::RowGather g{static_cast<char*>(p.out), p.out_stride * size, static_cast<const char*>(p.x),
                         p.x_stride * size, int64_t(row_bytes), token_of.get(), true};
  // Note [streaming stores]: the permuted rows past the cache share go out by non-temporal stores.
  const bool stream = cpu::stream_outputs(2.0 * double(pairs) * double(row_bytes), {&permuted});
  cpu::parallel_tasks(tasks.count(), [&](int64_t task) {
    cpu::gather_rows(g, tasks.begin(task), tasks.end(task), stream);  // Note [row gather]
  });
}

void moe_unpermute_reference(const Context&, const TensorView& y, const TensorView& expert_out,
                             const TensorView& inv_perm, const TensorView& weights) {
  const MoeUnpermutePlan p = moe_unpermute_plan(y, expert_out, inv_perm, weights);
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t h = 0; h < p.hidden; ++h) {
      double acc = 0;
      for (int64_t j = 0; j < p.topk; ++j) {
        const int64_t row = inv_at(p.inv, p.inv_i64, t * p.topk + j);
        acc += double(p.weights[t * p.topk + j]) * load_as_double(p.in, p.dtype, row * p.in_stride + h);
      }
      store_from_double(p.y, p.dtype, t * p.y_stride + h, acc);
    }
}

void moe_unpermute_cpu(const Context&, const TensorView& y, const TensorView& expert_out,
                       const TensorView& inv_perm, const TensorView& weights) {
  MoeUnpermutePlan p = moe_unpermute_plan(y, expert_out, inv_perm, weights);
  // The bytes a call moves: the tokens' k expert rows and y.
  const double row_bytes = double(p.hidden) * double(y.itemsize());
  p.stream = cpu::stream_outputs(double(p.tokens) * double(p.topk + 1) * row_bytes, {&y});
  moe_unpermute_cpu_run(p);
}

const char* moe_cpu_reason(const TensorView& t) {
  if (!t.device.is_cpu()) return "tensors are not on the cpu";
  switch (t.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}
const char* moe_permute_cpu_applicable(const TensorView&, const TensorView&, const TensorView&,
                                       const TensorView& x, const TensorView&, int64_t) {
  return moe_cpu_reason(x);
}
const char* moe_unpermute_cpu_applicable(const TensorView&, const TensorView& expert_out,
                                         const TensorView&, const TensorView&) {
  return moe_cpu_reason(expert_out);
}

// ---- cases ---------------------------------------------------------------------------------------
TensorInit index_init(const Shape& shape, double low, double high, DType dtype) {
  TensorInit t;
  t.shape = shape;
  t.fill = Fill::integers;
  t.low = low;
  t.high = high;
  t.fixed_dtype = true;
  t.dtype = dtype;
  return t;
}

struct MoeShape {
  int64_t tokens, hidden, experts, topk;
  int64_t pad = 0, out_pad = 0;
  int64_t only_expert = -1;  // >= 0: every id is this expert
};

Case permute_case(std::string label, CaseGroup group, const MoeShape& s) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  TensorInit x;
  x.shape = Shape{s.tokens, s.hidden};
  x.row_pad = s.pad;
  c.args.push_back({"x", x});
  TensorInit ids = index_init(Shape{s.tokens, s.topk}, 0, double(s.experts), DType::i32);
  if (s.only_expert >= 0) {
    ids.fill = Fill::values;
    ids.values = {double(s.only_expert)};
  }
  c.args.push_back({"topk_ids", ids});
  c.args.push_back({"num_experts", Value(s.experts)});
  if (s.out_pad > 0) {
    TensorInit out;
    out.shape = Shape{s.tokens * s.topk, s.hidden};
    out.row_pad = s.out_pad;
    c.args.push_back({"permuted", out});
  }
  return c;
}

Case unpermute_case(std::string label, CaseGroup group, const MoeShape& s, DType inv = DType::i32) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  const int64_t pairs = s.tokens * s.topk;
  TensorInit in;
  in.shape = Shape{pairs, s.hidden};
  in.row_pad = s.pad;
  c.args.push_back({"expert_out", in});
  c.args.push_back({"inv_perm", index_init(Shape{pairs}, 0, double(pairs), inv)});
  TensorInit w;
  w.shape = Shape{s.tokens, s.topk};
  w.fill = Fill::uniform;
  w.low = 0.0;
  w.high = 1.0;
  w.fixed_dtype = true;
  w.dtype = DType::f32;
  c.args.push_back({"topk_weights", w});
  if (s.out_pad > 0) {
    TensorInit out;
    out.shape = Shape{s.tokens, s.hidden};
    out.row_pad = s.out_pad;
    c.args.push_back({"y", out});
  }
  return c;
}

// Shapes: Qwen3-30B-A3B (hidden 2048, 128 experts, k = 8) and Mixtral-8x7B (hidden 4096, 8
// experts, k = 2); the large group stops at 4096 tokens for Qwen3 (32k pairs of 2048) to keep the
// reference tractable, Mixtral goes to 16384 tokens.
std::vector<MoeShape> moe_shapes(CaseGroup g) {
  switch (g) {
    case CaseGroup::small: return {{4, 16, 8, 2}, {7, 33, 5, 3}};
    case CaseGroup::medium: return {{16, 2048, 128, 8}, {16, 4096, 8, 2}};
    default: break;
  }
  std::vector<MoeShape> v;
  for (int64_t t : {1, 16, 1024, 4096}) v.push_back({t, 2048, 128, 8});
  v.push_back({16384, 4096, 8, 2});
  return v;
}

std::string shape_label(const MoeShape& s) {
  return "t" + std::to_string(s.tokens) + "_h" + std::to_string(s.hidden) + "_e" +
         std::to_string(s.experts) + "_k" + std::to_string(s.topk);
}

std::vector<Case> moe_permute_cases() {
  std::vector<Case> cases;
  for (CaseGroup g : {CaseGroup::small, CaseGroup::medium, CaseGroup::large})
    for (const MoeShape& s : moe_shapes(g)) cases.push_back(permute_case(shape_label(s), g, s));
  cases.push_back(permute_case("0x8_e4_k2", CaseGroup::edge, {0, 8, 4, 2}));
  cases.push_back(permute_case("1x1_e1_k1", CaseGroup::edge, {1, 1, 1, 1}));
  cases.push_back(permute_case("9x37_e64_k3_pads", CaseGroup::edge, {9, 37, 64, 3, 5, 3}));
  cases.push_back(permute_case("13x24_e6_k4_all_expert3", CaseGroup::edge, {13, 24, 6, 4, 0, 0, 3}));
  cases.push_back(permute_case("5x8_e200_k6_empty_experts", CaseGroup::edge, {5, 8, 200, 6}));
  return cases;
}

std::vector<Case> moe_unpermute_cases() {
  std::vector<Case> cases;
  for (CaseGroup g : {CaseGroup::small, CaseGroup::medium, CaseGroup::large})
    for (const MoeShape& s : moe_shapes(g)) cases.push_back(unpermute_case(shape_label(s), g, s));
  cases.push_back(unpermute_case("0x8_k2", CaseGroup::edge, {0, 8, 4, 2}));
  cases.push_back(unpermute_case("1x1_k1", CaseGroup::edge, {1, 1, 1, 1}));
  cases.push_back(unpermute_case("9x37_k3_pads", CaseGroup::edge, {9, 37, 64, 3, 5, 3}));
  cases.push_back(unpermute_case("11x40_k8_inv_i64", CaseGroup::edge, {11, 40, 8, 8}, DType::i64));
  return cases;
}

// ---- shapes and costs ----------------------------------------------------------------------------
std::vector<OutputSpec> moe_permute_outputs(const ArgList& a) {
  const TensorView &x = a.tensor("x"), &ids = a.tensor("topk_ids");
  const int64_t pairs = x.size(0) * (ids.ndim == 2 ? ids.size(1) : 0);
  return {{"permuted", Shape{pairs, x.size(1)}, x.dtype},
          {"expert_offsets", Shape{a.i64("num_experts") + 1}, DType::i64},
          {"inv_perm", Shape{pairs}, DType::i32}};
}

// Fewest bytes: x once (a token's k copies come from one read), the ids, every permuted row
// written, offsets and inv_perm written. No flops.
Cost moe_permute_cost(const ArgList& a) {
  const TensorView &x = a.tensor("x"), &ids = a.tensor("topk_ids");
  const double pairs = double(ids.numel());
  const double row = double(x.size(1)) * double(x.itemsize());
  return Cost{bytes_of(x) + bytes_of(ids) + pairs * row + pairs * 4.0 +
                  8.0 * double(a.i64("num_experts") + 1),
              0.0};
}

std::vector<OutputSpec> moe_unpermute_outputs(const ArgList& a) {
  const TensorView &in = a.tensor("expert_out"), &w = a.tensor("topk_weights");
  return {{"y", Shape{w.size(0), in.size(1)}, in.dtype}};
}

// Reads every expert row, inv_perm and the weights, writes y; 2 flops (mul + add) per element
// of expert_out.
Cost moe_unpermute_cost(const ArgList& a) {
  const TensorView &in = a.tensor("expert_out"), &w = a.tensor("topk_weights"),
                   &inv = a.tensor("inv_perm");
  const double y = double(w.size(0)) * double(in.size(1)) * double(in.itemsize());
  return Cost{bytes_of(in) + bytes_of(inv) + bytes_of(w) + y, 2.0 * double(in.numel())};
}

}  // namespace

void register_moe(Registry& reg) {
  OpEntry& permute = reg.add_op<MoePermute>();
  permute.outputs = moe_permute_outputs;
  permute.cost = moe_permute_cost;
  permute.cases = moe_permute_cases;
  reg.add_kernel<MoePermute>(reference_kernel_desc("counting sort, element copies through double"),
                             &moe_permute_reference);
  reg.add_kernel<MoePermute>(cpu_kernel_desc("serial counting sort of the ids + OpenMP row copies (streamed past the cache)"),
                             &moe_permute_cpu, &moe_permute_cpu_applicable);

  OpEntry& unpermute = reg.add_op<MoeUnpermute>();
  unpermute.outputs = moe_unpermute_outputs;
  unpermute.cost = moe_unpermute_cost;
  unpermute.cases = moe_unpermute_cases;
  reg.add_kernel<MoeUnpermute>(reference_kernel_desc("plain loops, weighted sum in double"),
                               &moe_unpermute_reference);
  reg.add_kernel<MoeUnpermute>(
      cpu_kernel_desc("OpenMP over tokens, SIMD widening, f32 accumulator row, one rounding"),
      &moe_unpermute_cpu, &moe_unpermute_cpu_applicable);
}

}  // namespace opforge
