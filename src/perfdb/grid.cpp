// The ops the collector and the estimator know (perfdb::known_ops), the harness case of each op at
// a grid point (case_at) and its cost model there without the tensors (cost_at).
//
// Every op runs with its default options unless a dim says otherwise:
//   rms_norm, gemma_rms_norm, fused_add_rms_norm, gemma_fused_add_rms_norm: x [tokens, hidden],
//     w [hidden] (fused: residual [tokens, hidden]); eps default, offset 0.
//   layer_norm: x [tokens, hidden], w and b [hidden] (nn.LayerNorm with its bias).
//   silu_and_mul, gelu_and_mul: x [tokens, 2 d]; gelu_and_mul with approximate = "tanh".
//   rotary_embedding: NeoX, rotary_dim = head_size, positions in [0, tokens), a cache of
//     max(tokens, 1) rows; query [tokens, q_heads * head_size], key [tokens, kv_heads * head_size].
//   linear: x [tokens, k], W [n, k], no bias.
//   attention_prefill: causal, `batch` sequences of `tokens` each (cu_seqlens 0, t, 2t, ...).
//   attention_decode: q [batch, q_heads, head_dim], caches [batch, context, kv_heads, head_dim],
//     every seq_lens = context.
//   topk_softmax: gating_output [tokens, experts], topk = k, renormalize.
//   embedding: ids in [0, vocab), W [vocab, hidden].
//   moe_permute: x [tokens, hidden], topk_ids i32 [tokens, k] uniform in [0, experts).
//   moe_unpermute: expert_out [tokens * k, hidden], inv_perm i32 [tokens * k] uniform in
//     [0, tokens * k) (random rows, like a permutation's gather), topk_weights f32 [tokens, k].
// Floating inputs cycle through 251 values spread over [-1, 1) (weights of linear scaled by
// 1 / sqrt(k); norm weights U(0.5, 1.5)): the values do not matter to the timing, and a cycled list
// is the cheapest fill to generate for tensors of a billion elements.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/instance.h"
#include "harness/materialize.h"
#include "opforge/collect.h"
#include "opforge/perfdb.h"
#include "opforge/registry.h"
#include "ops/rotary/rotary.h"
#include "perfdb/collect_internal.h"

namespace opforge::perfdb {

namespace {

// 251 numbers spread over [-1, 1) in a scrambled order (i * 97 mod 251), cycled: generating them
// costs a copy per element, not a random draw, which matters for weights of a billion elements.
const std::vector<double>& cycle_values() {
  static const std::vector<double> v = [] {
    std::vector<double> out(251);
    for (int i = 0; i < 251; ++i) out[size_t(i)] = -1.0 + 2.0 * double((i * 97) % 251) / 251.0;
    return out;
  }();
  return v;
}

TensorInit floating(Shape shape, double scale = 1.0) {
  TensorInit t;
  t.shape = shape;
  t.fill = Fill::values;
  t.values = cycle_values();
  t.scale = scale;
  return t;
}

TensorInit positive(Shape shape) {
  TensorInit t;
  t.shape = shape;
  t.fill = Fill::uniform_positive;
  return t;
}

TensorInit integers(Shape shape, double low, double high, DType dtype) {
  TensorInit t;
  t.shape = shape;
  t.fill = Fill::integers;
  t.low = low;
  t.high = high;
  t.fixed_dtype = true;
  t.dtype = dtype;
  return t;
}

TensorInit index_values(std::vector<double> values) {
  TensorInit t;
  t.shape = Shape{int64_t(values.size())};
  t.fill = Fill::values;
  t.fixed_dtype = true;
  t.dtype = DType::i32;
  t.values = std::move(values);
  if (t.values.empty()) t.values.push_back(0);  // never read: the tensor has no elements
  return t;
}

void add(Case& c, const char* name, TensorInit t) { c.args.push_back({name, std::move(t)}); }
void add(Case& c, const char* name, Value v) { c.args.push_back({name, std::move(v)}); }

// Every dim of op_grid(op) present, none other, all >= 0 (sizes >= 1 where a zero size would
// make no call: hidden, heads, head sizes, n, k, vocab, experts).
void check_dims(const OpGrid& g, const Dims& dims) {
  for (const std::string& d : g.dims)
    if (!dims.count(d)) {
      std::string have;
      for (const auto& [k, v] : dims) have += (have.empty() ? "" : ", ") + k;
      throw Error(ErrorCode::invalid_argument, "perfdb: " + g.op + " needs dim '" + d + "' (dims: " +
                                                   detail::join_names(g.dims) + "; given: " + have + ")");
    }
  for (const auto& [k, v] : dims) {
    if (std::find(g.dims.begin(), g.dims.end(), k) == g.dims.end())
      throw Error(ErrorCode::invalid_argument,
                  "perfdb: " + g.op + " has no dim '" + k + "' (dims: " + detail::join_names(g.dims) + ")");
    const bool may_be_zero = k == "tokens" || k == "batch" || k == "context";
    if (v < (may_be_zero ? 0 : 1))
      throw Error(ErrorCode::invalid_argument, "perfdb: " + g.op + " dim '" + k + "' = " +
                                                   std::to_string(v) + " (expected >= " +
                                                   (may_be_zero ? "0" : "1") + ")");
  }
}

std::string point_label(const OpGrid& g, const Dims& dims) {
  std::string s = "grid";
  for (const std::string& d : g.dims) s += "_" + d + std::to_string(dims.at(d));
  return s;
}

// A non-null address no cost model dereferences (they read shapes; index tensors are real).
void* dummy_address() {
  alignas(64) static char byte[64];
  return byte;
}

}  // namespace

std::string detail::join_names(const std::vector<std::string>& items, const char* sep) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : sep) + i;
  return s;
}

const std::vector<OpGrid>& known_ops() {
  static const std::vector<OpGrid> ops = {
      {"rms_norm", {"tokens", "hidden"}, {"tokens"}},
      {"gemma_rms_norm", {"tokens", "hidden"}, {"tokens"}},
      {"fused_add_rms_norm", {"tokens", "hidden"}, {"tokens"}},
      {"gemma_fused_add_rms_norm", {"tokens", "hidden"}, {"tokens"}},
      {"layer_norm", {"tokens", "hidden"}, {"tokens"}},
      {"silu_and_mul", {"tokens", "d"}, {"tokens"}},
      {"gelu_and_mul", {"tokens", "d"}, {"tokens"}},
      {"rotary_embedding", {"tokens", "q_heads", "kv_heads", "head_size"}, {"tokens"}},
      {"linear", {"tokens", "n", "k"}, {"tokens"}},
      {"attention_prefill", {"batch", "tokens", "q_heads", "kv_heads", "head_dim"}, {"batch", "tokens"}},
      {"attention_decode", {"batch", "context", "q_heads", "kv_heads", "head_dim"}, {"batch", "context"}},
      {"topk_softmax", {"tokens", "experts", "k"}, {"tokens"}},
      {"embedding", {"tokens", "vocab", "hidden"}, {"tokens"}},
      {"moe_permute", {"tokens", "hidden", "experts", "k"}, {"tokens"}},
      {"moe_unpermute", {"tokens", "hidden", "experts", "k"}, {"tokens"}},
  };
  return ops;
}

const OpGrid& op_grid(const std::string& op) {
  std::vector<std::string> names;
  for (const OpGrid& g : known_ops()) {
    if (g.op == op) return g;
    names.push_back(g.op);
  }
  throw Error(ErrorCode::unknown_name,
              "perfdb: no grid for op '" + op + "'; known ops: " + detail::join_names(names));
}

Case case_at(const std::string& op, const Dims& dims) {
  const OpGrid& g = op_grid(op);
  check_dims(g, dims);
  auto d = [&](const char* name) { return dims.at(name); };
  Case c;
  c.label = point_label(g, dims);
  c.group = CaseGroup::large;
  if (op == "rms_norm" || op == "gemma_rms_norm" || op == "fused_add_rms_norm" ||
      op == "gemma_fused_add_rms_norm" || op == "layer_norm") {
    const Shape rows{d("tokens"), d("hidden")};
    add(c, "x", floating(rows));
    if (op.find("fused_add") != std::string::npos) add(c, "residual", floating(rows));
    add(c, "w", positive(Shape{d("hidden")}));
    if (op == "layer_norm") add(c, "b", floating(Shape{d("hidden")}));
  } else if (op == "silu_and_mul" || op == "gelu_and_mul") {
    add(c, "x", floating(Shape{d("tokens"), 2 * d("d")}));
    if (op == "gelu_and_mul") add(c, "approximate", Value(std::string("tanh")));
  } else if (op == "rotary_embedding") {
    const int64_t tokens = d("tokens"), hs = d("head_size"), max_pos = std::max<int64_t>(tokens, 1);
    if (hs % 2) throw Error(ErrorCode::invalid_argument, "perfdb: rotary_embedding head_size must be even");
    add(c, "positions", integers(Shape{tokens}, 0, double(max_pos), DType::i64));
    add(c, "query", floating(Shape{tokens, d("q_heads") * hs}));
    add(c, "key", floating(Shape{tokens, d("kv_heads") * hs}));
    TensorInit cache;  // a real RoPE cache: in-place calls keep their values (see ops/rotary/rotary.h)
    cache.shape = Shape{max_pos, hs};
    cache.fill = Fill::values;
    cache.values = rope_cos_sin_cache(max_pos, hs);
    add(c, "cos_sin_cache", cache);
    add(c, "head_size", Value(hs));
  } else if (op == "linear") {
    add(c, "x", floating(Shape{d("tokens"), d("k")}));
    add(c, "w", floating(Shape{d("n"), d("k")}, 1.0 / std::sqrt(double(d("k")))));
  } else if (op == "attention_prefill") {
    const int64_t b = d("batch"), t = d("tokens"), hd = d("head_dim");
    add(c, "q", floating(Shape{b * t, d("q_heads"), hd}));
    add(c, "k", floating(Shape{b * t, d("kv_heads"), hd}));
    add(c, "v", floating(Shape{b * t, d("kv_heads"), hd}));
    std::vector<double> cu;
    for (int64_t i = 0; i <= b; ++i) cu.push_back(double(i * t));
    add(c, "cu_seqlens", index_values(cu));
  } else if (op == "attention_decode") {
    const int64_t b = d("batch"), ctx = d("context"), hd = d("head_dim");
    add(c, "q", floating(Shape{b, d("q_heads"), hd}));
    add(c, "k_cache", floating(Shape{b, ctx, d("kv_heads"), hd}));
    add(c, "v_cache", floating(Shape{b, ctx, d("kv_heads"), hd}));
    add(c, "seq_lens", index_values(std::vector<double>(size_t(b), double(ctx))));
  } else if (op == "topk_softmax") {
    add(c, "gating_output", floating(Shape{d("tokens"), d("experts")}));
    add(c, "topk", Value(d("k")));
    add(c, "renormalize", Value(true));
  } else if (op == "embedding") {
    add(c, "ids", integers(Shape{d("tokens")}, 0, double(d("vocab")), DType::i32));
    add(c, "w", floating(Shape{d("vocab"), d("hidden")}));
  } else if (op == "moe_permute") {
    add(c, "x", floating(Shape{d("tokens"), d("hidden")}));
    add(c, "topk_ids", integers(Shape{d("tokens"), d("k")}, 0, double(d("experts")), DType::i32));
    add(c, "num_experts", Value(d("experts")));
  } else if (op == "moe_unpermute") {
    const int64_t pairs = d("tokens") * d("k");
    add(c, "expert_out", floating(Shape{pairs, d("hidden")}));
    add(c, "inv_perm", integers(Shape{pairs}, 0, double(std::max<int64_t>(pairs, 1)), DType::i32));
    TensorInit w = integers(Shape{d("tokens"), d("k")}, 0, 1, DType::f32);
    w.fill = Fill::uniform;
    add(c, "topk_weights", w);
  } else {
    throw Error(ErrorCode::internal, "perfdb: case_at has no case for known op '" + op + "'");
  }
  return c;
}

namespace {

// The op's arguments at `dims` as views: fixed-dtype (index) inputs are materialized, since cost
// models may read them (attention's offsets and lengths); every other tensor is a view of the
// right shape and dtype at a dummy address. `keep` owns the materialized ones.
std::vector<Value> shape_values(const OpEntry& e, const Case& c, DType dtype, std::vector<Tensor>& keep) {
  using namespace harness::detail;
  std::vector<ArgPlan> plan = plan_case(e, c);
  std::vector<Value> values(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const ArgPlan& p = plan[i];
    if (!p.is_tensor) {
      values[i] = p.scalar;
    } else if (p.is_output || !p.present) {
      values[i] = None{};
    } else if (p.init.fixed_dtype) {
      Rng rng(mix_seed(20261125, e.name, c.label, e.args[i].name));
      keep.push_back(make_tensor(p.init.shape, p.init.dtype, Device::cpu(), generate(p.init, p.init.dtype, rng)));
      values[i] = keep.back().view();
    } else {
      values[i] = TensorView(dummy_address(), dtype, p.init.shape);
    }
  }
  for (const OutputSpec& s : output_specs(e, values))
    values[e.arg_index(s.name)] = TensorView(dummy_address(), s.dtype, s.shape);
  return values;
}

}  // namespace

Cost cost_at(const std::string& op, const std::string& dtype, const Dims& dims) {
  Case c = case_at(op, dims);
  const OpEntry& e = global_registry().op(op);
  if (!e.cost) throw Error(ErrorCode::internal, "perfdb: op '" + op + "' has no cost model");
  std::vector<Tensor> keep;
  std::vector<Value> values = shape_values(e, c, parse_dtype(dtype), keep);
  return e.cost(ArgList(e.name, e.args, values));
}

double footprint_bytes(const std::string& op, const std::string& dtype, const Dims& dims) {
  Case c = case_at(op, dims);
  const OpEntry& e = global_registry().op(op);
  std::vector<Tensor> keep;
  double bytes = 0;
  for (const Value& v : shape_values(e, c, parse_dtype(dtype), keep))
    if (const auto* t = std::get_if<TensorView>(&v); t && t->defined()) bytes += bytes_of(*t);
  return bytes;
}

}  // namespace opforge::perfdb

namespace opforge::perfdb {

namespace {

const KernelEntry* kernel_named(const OpEntry& e, const std::string& impl) {
  for (const KernelEntry& k : e.kernels)
    if (k.impl() == impl) return &k;
  return nullptr;
}

}  // namespace

// Note [kernels that cannot run the shape] (src/perfdb/database.cpp): the kernel's own predicate
// on the call's arguments as views at a 64-byte aligned dummy address (shape_values), so a
// predicate on alignment passes and one on dtype, head size or head ratio speaks.
std::string kernel_refusal(const std::string& op, const std::string& impl, const std::string& dtype,
                           const Dims& dims) {
  const OpEntry* e = global_registry().find(op);
  const KernelEntry* k = e ? kernel_named(*e, impl) : nullptr;
  if (!k || !k->fn || !k->boxed_predicate) return "";  // not in this build, or no predicate
  try {
    const Case c = case_at(op, dims);
    std::vector<Tensor> keep;
    const std::vector<Value> values = shape_values(*e, c, parse_dtype(dtype), keep);
    const char* why = k->boxed_predicate(k->predicate, values);
    return why ? why : "";
  } catch (const Error&) {
    return "";  // no case at these dims: cannot tell
  }
}

std::string kernel_that_runs(const std::string& op, const std::string& impl, const std::string& dtype,
                             const Dims& dims, const RefusalFn& refusal) {
  const OpEntry* e = global_registry().find(op);
  const KernelEntry* measured = e ? kernel_named(*e, impl) : nullptr;
  if (!measured) return "";
  std::vector<const KernelEntry*> same_device;
  for (const KernelEntry& k : e->kernels)
    if (k.desc.device == measured->desc.device && !k.is_reference()) {
      if (!k.fn) return "";  // a kernel of that device not in this build: cannot tell
      same_device.push_back(&k);
    }
  std::stable_sort(same_device.begin(), same_device.end(),
                   [](const KernelEntry* a, const KernelEntry* b) { return a->desc.priority > b->desc.priority; });
  for (const KernelEntry* k : same_device) {
    if (!k->claims(parse_dtype(dtype))) continue;
    const std::string why = refusal ? refusal(op, k->impl(), dtype, dims) : kernel_refusal(op, k->impl(), dtype, dims);
    if (why.empty()) return k->impl();
  }
  return "";
}

}  // namespace opforge::perfdb
