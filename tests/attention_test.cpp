// The attention family (ops/attention): argument checks of every op (the error names the
// argument; rejected calls leave outputs untouched), the reference kernels against hand-computed
// values and the mask / scale conventions, decode against the last row of prefill, the cpu
// kernels against the reference (f32, bf16, f16) and their determinism across thread counts,
// registration and shape functions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_info.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/attention/internal.h"
#include "tests/test_util.h"

namespace opforge {
namespace {

using test_util::expect_arg_error;

const Context kCtx{};

Tensor filled(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::zeros(shape, dtype);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_double(t.data(), dtype, i, normal(gen));
  return t;
}

Tensor values(const Shape& shape, DType dtype, const std::vector<double>& v) {
  Tensor t = Tensor::zeros(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) store_from_double(t.data(), dtype, int64_t(i), v[i]);
  return t;
}

double at(const Tensor& t, int64_t i) { return load_as_double(t.data(), t.view().dtype, i); }

// A packed batch: q [T, Hq, D], k, v [T, Hkv, D], out, lse, cu_seqlens.
struct Prefill {
  Tensor q, k, v, out, lse, cu;
  Prefill(const std::vector<int64_t>& lens, int64_t hq, int64_t hkv, int64_t d, DType dtype,
          uint32_t seed = 1) {
    std::vector<double> offsets{0};
    for (int64_t n : lens) offsets.push_back(offsets.back() + double(n));
    const int64_t tokens = int64_t(offsets.back());
    q = filled({tokens, hq, d}, dtype, seed);
    k = filled({tokens, hkv, d}, dtype, seed + 1);
    v = filled({tokens, hkv, d}, dtype, seed + 2);
    out = Tensor::zeros({tokens, hq, d}, dtype);
    lse = Tensor::zeros({hq, tokens}, dtype == DType::f64 ? DType::f64 : DType::f32);
    cu = values({int64_t(offsets.size())}, DType::i32, offsets);
  }
};

// ---- argument errors -------------------------------------------------------------------------
TEST(AttentionChecks, PrefillRejectsBadArguments) {
  Prefill p({3, 5}, 4, 2, 8, DType::f32);
  auto check = [&](const TensorView& out, const TensorView& lse, const TensorView& q,
                   const TensorView& k, const TensorView& v, const TensorView& cu,
                   double scale = 0.0, int64_t window = -1) {
    AttentionPrefill::check(out, lse, q, k, v, cu, true, scale, window);
  };
  EXPECT_NO_THROW(check(p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view()));
  const TensorView o = p.out.view(), l = p.lse.view(), q = p.q.view(), k = p.k.view(), v = p.v.view();
  expect_arg_error([&] { check(o, l, q, k, v, values({3}, DType::i32, {1, 3, 8}).view()); },
                   "cu_seqlens", "cu_seqlens[0] = 0");
  expect_arg_error([&] { check(o, l, q, k, v, values({3}, DType::i32, {0, 5, 3}).view()); },
                   "cu_seqlens", "non-decreasing");
  expect_arg_error([&] { check(o, l, q, k, v, values({3}, DType::i32, {0, 3, 7}).view()); },
                   "cu_seqlens", "last offset = tokens of q (8), got 7");
  expect_arg_error([&] { check(o, l, q, k, v, values({3}, DType::f32, {0, 3, 8}).view()); },
                   "cu_seqlens", "dtype i32 or i64");
  expect_arg_error([&] { check(o, l, q, k, v, Tensor::zeros({0}, DType::i64).view()); },
                   "cu_seqlens", "at least 1 element");
  expect_arg_error([&] { check(o, l, q, filled({8, 3, 8}, DType::f32, 3).view(), v, p.cu.view()); },
                   "k", "dividing the 4 query heads");
  expect_arg_error([&] { check(o, l, q, filled({8, 2, 7}, DType::f32, 3).view(), v, p.cu.view()); },
                   "k", "expected shape [8, 2, 8]");
  expect_arg_error([&] { check(o, l, q, k, filled({8, 2, 8}, DType::bf16, 3).view(), p.cu.view()); },
                   "v", "expected dtype f32");
  expect_arg_error([&] { check(o, l, filled({8, 4}, DType::f32, 3).view(), k, v, p.cu.view()); },
                   "q", "3 dims");
  expect_arg_error([&] { check(o, Tensor::zeros({8, 4}, DType::f32).view(), q, k, v, p.cu.view()); },
                   "lse", "expected shape [4, 8]");
  expect_arg_error([&] { check(o, Tensor::zeros({4, 8}, DType::bf16).view(), q, k, v, p.cu.view()); },
                   "lse", "expected dtype f32");
  expect_arg_error([&] { check(Tensor::zeros({8, 4, 8}, DType::f16).view(), l, q, k, v, p.cu.view()); },
                   "out", "got f16");
  expect_arg_error([&] { check(o, l, q, k, v, p.cu.view(), NAN); }, "softmax_scale", "got nan");
  expect_arg_error([&] { check(o, l, q, k, v, p.cu.view(), 0.0, -2); }, "window_left", "got -2");
  expect_arg_error([&] { check(q, l, q, k, v, p.cu.view()); }, "out", "no overlap with 'q'");
  expect_arg_error([&] { check(o, l, TensorView{}, k, v, p.cu.view()); }, "q", "got none");
}

TEST(AttentionChecks, BackwardAndDecodeRejectBadArguments) {
  Prefill p({3, 5}, 4, 2, 8, DType::bf16);
  Tensor dq = Tensor::zeros({8, 4, 8}, DType::bf16), dk = Tensor::zeros({8, 2, 8}, DType::bf16);
  Tensor dv = Tensor::zeros({8, 2, 8}, DType::bf16), dout = filled({8, 4, 8}, DType::bf16, 9);
  auto backward = [&](const TensorView& dq_, const TensorView& dk_, const TensorView& lse) {
    AttentionPrefillBackward::check(dq_, dk_, dv.view(), dout.view(), p.q.view(), p.k.view(),
                                    p.v.view(), p.out.view(), lse, p.cu.view(), true, 0.0, -1);
  };
  EXPECT_NO_THROW(backward(dq.view(), dk.view(), p.lse.view()));
  expect_arg_error([&] { backward(dq.view(), Tensor::zeros({8, 4, 8}, DType::bf16).view(), p.lse.view()); },
                   "dk", "expected shape [8, 2, 8]");
  expect_arg_error([&] { backward(dq.view(), dk.view(), Tensor::zeros({4, 8}, DType::f64).view()); },
                   "lse", "expected dtype f32");
  expect_arg_error([&] { backward(dq.view(), dout.view(), p.lse.view()); }, "dk");

  Tensor q = filled({3, 4, 16}, DType::f32, 1), out = Tensor::zeros({3, 4, 16}, DType::f32);
  Tensor kc = filled({3, 10, 2, 16}, DType::f32, 2), vc = filled({3, 10, 2, 16}, DType::f32, 3);
  auto decode = [&](const TensorView& lens, const TensorView& k_cache) {
    AttentionDecode::check(out.view(), q.view(), k_cache, vc.view(), lens, 0.0);
  };
  EXPECT_NO_THROW(decode(values({3}, DType::i32, {0, 10, 4}).view(), kc.view()));
  expect_arg_error([&] { decode(values({3}, DType::i32, {0, 11, 4}).view(), kc.view()); },
                   "seq_lens", "seq_lens[1] = 11");
  expect_arg_error([&] { decode(values({3}, DType::i32, {-1, 1, 4}).view(), kc.view()); },
                   "seq_lens", "values in [0, max_ctx = 10]");
  expect_arg_error([&] { decode(values({3}, DType::i64, {1, 1, 4}).view(), kc.view()); },
                   "seq_lens", "dtype i32");
  expect_arg_error([&] { decode(values({2}, DType::i32, {1, 1}).view(), kc.view()); },
                   "seq_lens", "expected shape [3]");
  expect_arg_error([&] { decode(values({3}, DType::i32, {1, 1, 1}).view(), filled({3, 10, 3, 16}, DType::f32, 4).view()); },
                   "k_cache", "dividing the 4 query heads");
}

TEST(AttentionChecks, RejectedCallsLeaveOutputsUntouched) {
  Registry reg;
  register_attention(reg);
  Prefill p({3, 5}, 4, 2, 8, DType::f32);
  std::memset(p.out.data(), 0x5a, size_t(p.out.nbytes()));
  std::memset(p.lse.data(), 0x5a, size_t(p.lse.nbytes()));
  Tensor bad_cu = values({3}, DType::i32, {0, 6, 5});
  const std::vector<std::vector<Value>> calls = {
      {p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), bad_cu.view(), true, 0.0, int64_t(-1)},
      {p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, INFINITY, int64_t(-1)},
      {p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.0, int64_t(-5)},
  };
  for (const auto& args : calls) {
    EXPECT_THROW(reg.call("attention_prefill", args), Error);
    for (const Tensor* t : {&p.out, &p.lse}) {
      const auto* bytes = static_cast<const unsigned char*>(t->data());
      for (int64_t i = 0; i < t->nbytes(); ++i) ASSERT_EQ(bytes[i], 0x5a);
    }
  }
}

// ---- reference: hand-computed values and conventions -----------------------------------------
TEST(AttentionReference, HandExampleCausal) {
  // One sequence of 2 tokens, 1 head, D = 1, scale 1: s = q k.
  Tensor q = values({2, 1, 1}, DType::f64, {1.0, 2.0}), k = values({2, 1, 1}, DType::f64, {0.5, -1.0});
  Tensor v = values({2, 1, 1}, DType::f64, {3.0, 7.0}), cu = values({2}, DType::i64, {0, 2});
  Tensor out = Tensor::zeros({2, 1, 1}, DType::f64), lse = Tensor::zeros({1, 2}, DType::f64);
  attention_prefill_reference(kCtx, out.view(), lse.view(), q.view(), k.view(), v.view(), cu.view(), true, 1.0, -1);
  // Token 0 sees key 0 only: out = v0, lse = q0 k0.
  EXPECT_NEAR(at(out, 0), 3.0, 1e-12);
  EXPECT_NEAR(at(lse, 0), 0.5, 1e-12);
  // Token 1: scores 1 and -2.
  const double e1 = std::exp(1.0), e2 = std::exp(-2.0);
  EXPECT_NEAR(at(out, 1), (3.0 * e1 + 7.0 * e2) / (e1 + e2), 1e-12);
  EXPECT_NEAR(at(lse, 1), std::log(e1 + e2), 1e-12);
  // Non-causal token 0 sees both keys: scores 0.5 and -1.
  attention_prefill_reference(kCtx, out.view(), lse.view(), q.view(), k.view(), v.view(), cu.view(), false, 1.0, -1);
  const double f1 = std::exp(0.5), f2 = std::exp(-1.0);
  EXPECT_NEAR(at(out, 0), (3.0 * f1 + 7.0 * f2) / (f1 + f2), 1e-12);
}

TEST(AttentionReference, DefaultScaleAndWindowZero) {
  Prefill p({6}, 4, 2, 16, DType::f64);
  Tensor out2 = Tensor::zeros({6, 4, 16}, DType::f64), lse2 = Tensor::zeros({4, 6}, DType::f64);
  // softmax_scale <= 0 is 1 / sqrt(16) = 0.25.
  attention_prefill_reference(kCtx, p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.0, -1);
  attention_prefill_reference(kCtx, out2.view(), lse2.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.25, -1);
  for (int64_t i = 0; i < p.out.numel(); ++i) ASSERT_EQ(at(p.out, i), at(out2, i));
  // window_left = 0: each token sees itself only, so out = v of its kv head (h / 2).
  attention_prefill_reference(kCtx, out2.view(), lse2.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, -1.0, 0);
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t d = 0; d < 16; ++d)
        ASSERT_NEAR(at(out2, (t * 4 + h) * 16 + d), at(p.v, (t * 2 + h / 2) * 16 + d), 1e-12);
}

// ---- decode = the last row of a causal prefill of the same sequence ---------------------------
TEST(AttentionDecode, MatchesLastPrefillRow) {
  for (const char* impl : {"reference", "cpu"}) {
    SCOPED_TRACE(impl);
    const bool cpu = std::string(impl) == "cpu";
    const int64_t n = 37, hq = 8, hkv = 2, d = 64, max_ctx = 40;
    Prefill p({n}, hq, hkv, d, DType::f32, 5);
    // Cache of batch 1: the sequence's k, v in the first n rows, garbage past them.
    Tensor kc = filled({1, max_ctx, hkv, d}, DType::f32, 11), vc = filled({1, max_ctx, hkv, d}, DType::f32, 12);
    std::memcpy(kc.data(), p.k.data(), size_t(p.k.nbytes()));
    std::memcpy(vc.data(), p.v.data(), size_t(p.v.nbytes()));
    Tensor q = Tensor::zeros({1, hq, d}, DType::f32), out = Tensor::zeros({1, hq, d}, DType::f32);
    std::memcpy(q.data(), static_cast<const float*>(p.q.data()) + (n - 1) * hq * d, size_t(hq * d * 4));
    Tensor lens = values({1}, DType::i32, {double(n)});
    if (cpu) {
      attention_prefill_cpu(kCtx, p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.0, -1);
      attention_decode_cpu(kCtx, out.view(), q.view(), kc.view(), vc.view(), lens.view(), 0.0);
    } else {
      attention_prefill_reference(kCtx, p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.0, -1);
      attention_decode_reference(kCtx, out.view(), q.view(), kc.view(), vc.view(), lens.view(), 0.0);
    }
    for (int64_t i = 0; i < hq * d; ++i) ASSERT_NEAR(at(out, i), at(p.out, (n - 1) * hq * d + i), 1e-5);
  }
}

// ---- cpu kernels --------------------------------------------------------------------------------
double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(at(t, i)));
  return m;
}

void expect_close(const Tensor& a, const Tensor& r, double rtol) {
  const double scale = max_abs(r);
  for (int64_t i = 0; i < r.numel(); ++i)
    ASSERT_LE(std::abs(at(a, i) - at(r, i)), rtol * (std::abs(at(r, i)) + 1e-2 * scale)) << "element " << i;
}

TEST(AttentionCpu, PrefillAndBackwardMatchReference) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double rtol = dtype == DType::bf16 ? 2e-2 : dtype == DType::f16 ? 4e-3 : 1e-4;
    Prefill p({19, 0, 45}, 8, 2, 40, dtype, 21);
    Tensor out = Tensor::zeros({64, 8, 40}, dtype), lse = Tensor::zeros({8, 64}, DType::f32);
    attention_prefill_reference(kCtx, p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.0, 9);
    attention_prefill_cpu(kCtx, out.view(), lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.0, 9);
    expect_close(out, p.out, rtol);
    expect_close(lse, p.lse, 1e-5);
    Tensor dout = filled({64, 8, 40}, dtype, 33);
    Tensor grads[2][3];
    for (int impl = 0; impl < 2; ++impl) {
      grads[impl][0] = Tensor::zeros({64, 8, 40}, dtype);
      grads[impl][1] = Tensor::zeros({64, 2, 40}, dtype);
      grads[impl][2] = Tensor::zeros({64, 2, 40}, dtype);
      auto* fn = impl == 0 ? &attention_prefill_backward_reference : &attention_prefill_backward_cpu;
      fn(kCtx, grads[impl][0].view(), grads[impl][1].view(), grads[impl][2].view(), dout.view(), p.q.view(),
         p.k.view(), p.v.view(), p.out.view(), p.lse.view(), p.cu.view(), true, 0.0, 9);
    }
    for (int g = 0; g < 3; ++g) expect_close(grads[1][g], grads[0][g], rtol);
  }
}

TEST(AttentionCpu, BackwardIsDeterministicAcrossThreadCounts) {
  Prefill p({70, 33}, 8, 2, 32, DType::bf16, 41);
  attention_prefill_cpu(kCtx, p.out.view(), p.lse.view(), p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.0, -1);
  Tensor dout = filled({103, 8, 32}, DType::bf16, 42);
  std::vector<std::vector<unsigned char>> runs;
  for (int threads : {1, 2, 3}) {
    const int previous = cpu::set_thread_count_for_testing(threads);
    Tensor dq = Tensor::zeros({103, 8, 32}, DType::bf16), dk = Tensor::zeros({103, 2, 32}, DType::bf16);
    Tensor dv = Tensor::zeros({103, 2, 32}, DType::bf16);
    attention_prefill_backward_cpu(kCtx, dq.view(), dk.view(), dv.view(), dout.view(), p.q.view(), p.k.view(),
                                   p.v.view(), p.out.view(), p.lse.view(), p.cu.view(), true, 0.0, -1);
    cpu::set_thread_count_for_testing(previous);
    std::vector<unsigned char> bytes;
    for (const Tensor* t : {&dq, &dk, &dv}) {
      const auto* b = static_cast<const unsigned char*>(t->data());
      bytes.insert(bytes.end(), b, b + t->nbytes());
    }
    runs.push_back(std::move(bytes));
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

// ---- registration ------------------------------------------------------------------------------
TEST(AttentionRegistry, OpsKernelsCasesAndShapes) {
  Registry reg;
  register_attention(reg);
  for (const char* name : {"attention_prefill", "attention_prefill_backward", "attention_decode"}) {
    SCOPED_TRACE(name);
    const OpEntry& op = reg.op(name);
    ASSERT_NE(op.reference(), nullptr);
    const KernelEntry* cpu = op.kernel("cpu", DeviceKind::cpu);
    ASSERT_NE(cpu, nullptr);
    EXPECT_TRUE(cpu->claims(DType::bf16));
    EXPECT_FALSE(cpu->claims(DType::f64));
    ASSERT_TRUE(op.cases && op.outputs && op.cost);
    int groups[4] = {};
    for (const Case& c : op.cases()) ++groups[int(c.group)];
    for (int g : groups) EXPECT_GT(g, 0);
  }
  EXPECT_EQ(reg.op("attention_prefill").backward, "attention_prefill_backward");
  // Shapes and roofline of a 2-sequence batch (lengths 3 and 5, causal, no window).
  const OpEntry& op = reg.op("attention_prefill");
  Prefill p({3, 5}, 4, 2, 8, DType::bf16);
  const std::vector<Value> vals = {None{}, None{}, p.q.view(), p.k.view(), p.v.view(), p.cu.view(), true, 0.0, int64_t(-1)};
  ArgList args(op.name, op.args, vals);
  const std::vector<OutputSpec> outs = op.outputs(args);
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[1].name, "lse");
  EXPECT_EQ(outs[1].shape, Shape({4, 8}));
  EXPECT_EQ(outs[1].dtype, DType::f32);
  // Pairs: 3*4/2 + 5*6/2 = 21 per head, 4 heads, 4 flops per pair and dim of 8.
  EXPECT_EQ(op.cost(args).flops, 21.0 * 4 * 4 * 8);
  EXPECT_EQ(attention_pairs(9, true, 2), 1 + 2 + 3 * 7);
  EXPECT_EQ(attention_pairs(5, false, 1), 5 + 5 + 4 + 3 + 2);
}

}  // namespace
}  // namespace opforge
