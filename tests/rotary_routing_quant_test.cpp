// The rotary, routing and quant families (ops/rotary, ops/routing, ops/quant) and the f8e4m3
// dtype they need: e4m3 conversions over all 256 patterns, rounding and saturation, the vector
// conversion against the scalar one; argument checks (the error names the argument and nothing
// is written); hand-computed values the harness cannot know (rotations by known angles, tie
// breaking, group selection, quantized bytes).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/quant/internal.h"
#include "ops/rotary/internal.h"
#include "ops/routing/internal.h"
#include "tests/test_util.h"

namespace opforge {
namespace {

// ---- f8e4m3 (Note [fp8 e4m3]) ------------------------------------------------------------------
// The value of an e4m3 pattern from the format's definition (independent of dtype.cpp).
double e4m3_value(int b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return sign ? -v : v;
}

TEST(F8e4m3, AllPatternsWidenExactlyAndRoundTrip) {
  for (int b = 0; b < 256; ++b) {
    SCOPED_TRACE(b);
    const double want = e4m3_value(b);
    const float got = f8e4m3_to_f32(uint8_t(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
      EXPECT_EQ(f32_to_f8e4m3(got) & 0x7f, 0x7f);  // NaN stays NaN
      continue;
    }
    EXPECT_EQ(double(got), want);
    EXPECT_EQ(f32_to_f8e4m3(got), uint8_t(b));  // -0 included
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(f8e4m3_to_f32(0x08), 0x1p-6f);
}

TEST(F8e4m3, RoundsToNearestEvenAndSaturates) {
  // Between every two neighbouring finite non-negative values: the midpoint goes to the even
  // pattern, anything just off it to the nearer value.
  for (int b = 0; b < 0x7e; ++b) {
    SCOPED_TRACE(b);
    const float lo = f8e4m3_to_f32(uint8_t(b)), hi = f8e4m3_to_f32(uint8_t(b + 1));
    const float mid = 0.5f * (lo + hi);
    EXPECT_EQ(f32_to_f8e4m3(mid), uint8_t((b % 2 == 0) ? b : b + 1));
    EXPECT_EQ(f32_to_f8e4m3(std::nextafter(mid, 0.0f)), uint8_t(b));
    EXPECT_EQ(f32_to_f8e4m3(std::nextafter(mid, 1000.0f)), uint8_t(b + 1));
    EXPECT_EQ(f32_to_f8e4m3(-mid), uint8_t(0x80 | ((b % 2 == 0) ? b : b + 1)));
  }
  EXPECT_EQ(f32_to_f8e4m3(0x1p-10f), 0x00);             // half the smallest subnormal: to even (0)
  EXPECT_EQ(f32_to_f8e4m3(0x1p-10f * 1.0001f), 0x01);
  EXPECT_EQ(f32_to_f8e4m3(1e-30f), 0x00);
  EXPECT_EQ(f32_to_f8e4m3(449.0f), 0x7e);               // saturates instead of NaN
  EXPECT_EQ(f32_to_f8e4m3(480.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(NAN), 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(-NAN), 0xff);
  EXPECT_EQ(f32_to_f8e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
  // store_from_double rounds once (round to odd through f32).
  uint8_t q = 0;
  store_from_double(&q, DType::f8e4m3, 0, 1.0625 + 0x1p-40);  // just above the 1 / 1.125 tie
  EXPECT_EQ(f8e4m3_to_f32(q), 1.125f);
  store_from_double(&q, DType::f8e4m3, 0, 1.0625);  // the tie itself: to even (1.0)
  EXPECT_EQ(f8e4m3_to_f32(q), 1.0f);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::f8e4m3);
  EXPECT_EQ(dtype_size(DType::f8e4m3), 1);
  EXPECT_FALSE(is_floating(DType::f8e4m3));
}

TEST(F8e4m3, VectorConversionMatchesScalar) {
  std::vector<float> in;
  for (int b = 0; b < 256; ++b) in.push_back(f8e4m3_to_f32(uint8_t(b)));
  for (int b = 0; b < 0x7e; ++b) {
    const float mid = 0.5f * (f8e4m3_to_f32(uint8_t(b)) + f8e4m3_to_f32(uint8_t(b + 1)));
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) {
      in.push_back(v);
      in.push_back(-v);
    }
  }
  for (float v : {INFINITY, -INFINITY, 448.0f, 464.0f, 1e30f, 0x1p-10f, 1e-40f}) in.push_back(v);
  std::mt19937 gen(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = uint32_t(gen());
    float f;
    std::memcpy(&f, &bits, 4);
    in.push_back(f);
  }
  std::uniform_real_distribution<float> range(-500.0f, 500.0f);
  for (int i = 0; i < 200000; ++i) in.push_back(range(gen));
  in.push_back(3.0f);  // an odd count: the vector tail path
  std::vector<uint8_t> out(in.size());
  f32_to_f8e4m3_simd(in.data(), out.data(), int64_t(in.size()));
  int failures = 0;
  for (size_t i = 0; i < in.size(); ++i)
    if (out[i] != f32_to_f8e4m3(in[i]) && failures++ < 10)
      ADD_FAILURE() << "value " << in[i] << ": vector " << int(out[i]) << ", scalar " << int(f32_to_f8e4m3(in[i]));
  EXPECT_EQ(failures, 0);
}

// ---- helpers -------------------------------------------------------------------------------------
Registry& families() {
  static Registry reg;
  static bool done = [] {
    register_rotary(reg);
    register_routing(reg);
    register_quant(reg);
    return true;
  }();
  (void)done;
  return reg;
}

using test_util::bytes_of_tensor;
using test_util::tensor;
using test_util::values_of;

// The call throws invalid_argument naming `arg` and leaves every tensor in `watched` unchanged.
void expect_rejected(const std::string& op, const std::vector<Value>& args, const std::string& arg,
                     const std::vector<const Tensor*>& watched) {
  test_util::expect_rejected(families(), op, args, arg, watched);
}

// Runs `op` with kernel `impl` only.
void run_impl(const std::string& op, const std::vector<Value>& args, const std::string& impl) {
  families().call(op, args, Policy::parse(op + "=" + impl));
}

// ---- rotary --------------------------------------------------------------------------------------
TEST(RotaryChecks, RejectBadArguments) {
  Tensor pos = tensor({2}, DType::i64, {0, 1});
  Tensor q = tensor({2, 8}, DType::f32, std::vector<double>(16, 1.0));
  Tensor k = tensor({2, 4}, DType::f32, std::vector<double>(8, 2.0));
  Tensor cache = tensor({4, 4}, DType::f32, std::vector<double>(16, 0.5));
  const std::vector<const Tensor*> io = {&q, &k};
  auto call = [&](const TensorView& p, const TensorView& qq, const TensorView& kk, const TensorView& c,
                  int64_t hs) { return std::vector<Value>{p, qq, kk, c, hs, true}; };
  expect_rejected("rotary_embedding", call(pos, q, k, tensor({4, 3}, DType::f32, {}), 4), "cos_sin_cache", io);
  expect_rejected("rotary_embedding", call(pos, q, k, tensor({4, 6}, DType::f32, {}), 4), "cos_sin_cache", io);
  expect_rejected("rotary_embedding", call(tensor({2}, DType::i64, {0, 4}), q, k, cache, 4), "positions", io);
  expect_rejected("rotary_embedding", call(tensor({2}, DType::i64, {-1, 0}), q, k, cache, 4), "positions", io);
  expect_rejected("rotary_embedding", call(tensor({2}, DType::i32, {0, 1}), q, k, cache, 4), "positions", io);
  expect_rejected("rotary_embedding", call(pos, q, tensor({2, 6}, DType::f32, {}), cache, 4), "key", io);
  expect_rejected("rotary_embedding", call(pos, tensor({3, 8}, DType::f32, {}), k, cache, 4), "query", io);
  expect_rejected("rotary_embedding", call(pos, q, k, cache, 0), "head_size", io);
  expect_rejected("rotary_embedding", call(pos, q, k, tensor({4, 4}, DType::bf16, {}), 4), "cos_sin_cache", io);
  expect_rejected("rotary_embedding_backward", call(pos, q, q, cache, 4), "dquery", io);  // overlap
  Tensor x = tensor({2, 3, 8}, DType::f32, std::vector<double>(48, 1.0));
  Tensor y = tensor({2, 3, 8}, DType::f32, {});
  Tensor cos = tensor({2, 4}, DType::f32, {}), sin = tensor({2, 4}, DType::f32, {});
  const std::vector<const Tensor*> out = {&y};
  expect_rejected("apply_rotary_emb", {y.view(), x.view(), tensor({2, 5}, DType::f32, {}).view(), sin.view(), true}, "cos", out);
  expect_rejected("apply_rotary_emb", {y.view(), x.view(), cos.view(), tensor({2, 3}, DType::f32, {}).view(), true}, "sin", out);
  expect_rejected("apply_rotary_emb", {y.view(), x.view(), tensor({3, 4}, DType::f32, {}).view(), sin.view(), true}, "cos", out);
  expect_rejected("apply_rotary_emb", {tensor({2, 3, 7}, DType::f32, {}).view(), x.view(), cos.view(), sin.view(), true}, "y", out);
  expect_rejected("apply_rotary_emb", {y.view(), tensor({6, 8}, DType::f32, {}).view(), cos.view(), sin.view(), true}, "x", out);
  expect_rejected("apply_rotary_emb_backward", {y.view(), x.view(), cos.view(), tensor({2, 4}, DType::f16, {}).view(), true}, "sin", out);
}

// cos = 0, sin = 1: a quarter turn, o1 = -x2, o2 = x1 (Note [rotary pairs]).
struct QuarterTurn {
  bool neox;
  int64_t rotary_dim;
  std::vector<double> want;
};

TEST(RotaryValues, QuarterTurnNeoxGptjAndPartial) {
  const QuarterTurn cases[] = {{true, 4, {-3, -4, 1, 2}}, {false, 4, {-2, 1, -4, 3}},
                               {true, 2, {-2, 1, 3, 4}},  {false, 2, {-2, 1, 3, 4}}};
  for (const char* impl : {"reference", "cpu"})
    for (DType dtype : {DType::f32, DType::bf16})
      for (const QuarterTurn& c : cases) {
        SCOPED_TRACE(std::string(impl) + " " + dtype_name(dtype) + (c.neox ? " neox " : " gptj ") + std::to_string(c.rotary_dim));
        const int64_t half = c.rotary_dim / 2;
        std::vector<double> cache_values(size_t(3 * c.rotary_dim), 0.0);  // rows 0..2
        for (int64_t i = 0; i < half; ++i) cache_values[size_t(2 * c.rotary_dim + half + i)] = 1.0;  // row 2
        Tensor cache = tensor({3, c.rotary_dim}, dtype, cache_values);
        Tensor pos = tensor({1}, DType::i64, {2});
        Tensor q = tensor({1, 4}, dtype, {1, 2, 3, 4}), k = tensor({1, 8}, dtype, {1, 2, 3, 4, 1, 2, 3, 4});
        run_impl("rotary_embedding", {pos.view(), q.view(), k.view(), cache.view(), int64_t(4), c.neox},
                        impl);
        EXPECT_EQ(values_of(q), c.want);
        std::vector<double> k_want = c.want;
        k_want.insert(k_want.end(), c.want.begin(), c.want.end());
        EXPECT_EQ(values_of(k), k_want);  // both kv heads
        // The backward turns them back.
        run_impl("rotary_embedding_backward", {pos.view(), q.view(), k.view(), cache.view(), int64_t(4), c.neox},
                        impl);
        EXPECT_EQ(values_of(q), (std::vector<double>{1, 2, 3, 4}));
        // apply_rotary_emb: the same rotation from cos / sin rows.
        Tensor x = tensor({1, 1, 4}, dtype, {1, 2, 3, 4}), y = tensor({1, 1, 4}, dtype, {});
        Tensor cos = tensor({1, half}, dtype, std::vector<double>(size_t(half), 0.0));
        Tensor sin = tensor({1, half}, dtype, std::vector<double>(size_t(half), 1.0));
        run_impl("apply_rotary_emb", {y.view(), x.view(), cos.view(), sin.view(), c.neox},
                        impl);
        EXPECT_EQ(values_of(y), c.want);
      }
}

// ---- routing -------------------------------------------------------------------------------------
TEST(RoutingChecks, RejectBadArguments) {
  Tensor logits = tensor({2, 8}, DType::f32, std::vector<double>(16, 0.5));
  Tensor w = tensor({2, 2}, DType::f32, {}), ids = tensor({2, 2}, DType::i32, {});
  const std::vector<const Tensor*> out = {&w, &ids};
  expect_rejected("topk_softmax", {w.view(), ids.view(), logits.view(), int64_t(9), false}, "topk", out);
  expect_rejected("topk_softmax", {w.view(), ids.view(), logits.view(), int64_t(0), false}, "topk", out);
  expect_rejected("topk_softmax", {w.view(), tensor({2, 2}, DType::i64, {}).view(), logits.view(), int64_t(2), false}, "topk_ids", out);
  expect_rejected("topk_softmax", {tensor({2, 3}, DType::f32, {}).view(), ids.view(), logits.view(), int64_t(2), false}, "topk_weights", out);
  expect_rejected("topk_softmax", {w.view(), ids.view(), tensor({2, 8}, DType::i32, {}).view(), int64_t(2), false}, "gating_output", out);
  Tensor bias = tensor({8}, DType::f32, {});
  auto grouped = [&](const TensorView& b, int64_t topk, int64_t groups, int64_t keep, std::string scoring, double scaling) {
    return std::vector<Value>{w.view(), ids.view(), logits.view(), b, topk, true, groups, keep, scoring, scaling};
  };
  expect_rejected("grouped_topk", grouped(bias, 2, 3, 1, "sigmoid", 1.0), "num_expert_group", out);
  expect_rejected("grouped_topk", grouped(bias, 2, 4, 5, "sigmoid", 1.0), "topk_group", out);
  expect_rejected("grouped_topk", grouped(bias, 2, 4, 0, "sigmoid", 1.0), "topk_group", out);
  expect_rejected("grouped_topk", grouped(bias, 3, 4, 1, "sigmoid", 1.0), "topk", out);  // 1 group of 2
  expect_rejected("grouped_topk", grouped(bias, 2, 4, 2, "tanh", 1.0), "scoring_func", out);
  expect_rejected("grouped_topk", grouped(bias, 2, 4, 2, "sigmoid", 0.0), "routed_scaling_factor", out);
  expect_rejected("grouped_topk", grouped(tensor({7}, DType::f32, {}), 2, 4, 2, "sigmoid", 1.0), "e_score_correction_bias", out);
  expect_rejected("grouped_topk", grouped(bias, 2, 8, 2, "sigmoid", 1.0), "e_score_correction_bias", out);
}

TEST(RoutingValues, TopkSoftmaxBreaksTiesByLowerId) {
  for (const char* impl : {"reference", "cpu"}) {
    SCOPED_TRACE(impl);
    Tensor logits = tensor({1, 5}, DType::f32, {1, 3, 0, 3, 3});
    Tensor w = tensor({1, 3}, DType::f32, {}), ids = tensor({1, 3}, DType::i32, {});
    run_impl("topk_softmax", {w.view(), ids.view(), logits.view(), int64_t(3), false},
                    impl);
    EXPECT_EQ(values_of(ids), (std::vector<double>{1, 3, 4}));
    const double z = std::exp(1.0) + 3 * std::exp(3.0) + 1.0;
    for (double v : values_of(w)) EXPECT_NEAR(v, std::exp(3.0) / z, 1e-6);
    run_impl("topk_softmax", {w.view(), ids.view(), logits.view(), int64_t(3), true},
                    impl);
    for (double v : values_of(w)) EXPECT_NEAR(v, 1.0 / 3.0, 1e-6);
  }
}

TEST(RoutingValues, GroupedTopkKeepsTheBestGroups) {
  // 8 experts in 4 groups of 2. Without bias a group scores its max logit: groups 3 (7) and
  // 0 (5) are kept although group 1 has the largest pair sum; the best three of experts
  // {0, 1, 6, 7} are 7, 0, 6.
  const std::vector<double> x = {5, -4, 4.5, 4.5, 0, 0, -1, 7};
  for (const char* impl : {"reference", "cpu"}) {
    SCOPED_TRACE(impl);
    Tensor logits = tensor({1, 8}, DType::f32, x);
    Tensor w = tensor({1, 3}, DType::f32, {}), ids = tensor({1, 3}, DType::i32, {});
    run_impl("grouped_topk", {w.view(), ids.view(), logits.view(), None{}, int64_t(3), false, int64_t(4),
                                     int64_t(2), std::string("sigmoid"), 2.0},
                    impl);
    EXPECT_EQ(values_of(ids), (std::vector<double>{7, 0, 6}));
    const std::vector<double> got = values_of(w);
    const double sig[] = {1 / (1 + std::exp(-7.0)), 1 / (1 + std::exp(-5.0)), 1 / (1 + std::exp(1.0))};
    for (int j = 0; j < 3; ++j) EXPECT_NEAR(got[size_t(j)], 2.0 * sig[j], 1e-6);
    // With a bias, groups score the sum of their top two keys (s + bias): group 1 wins, and
    // the weights are the unbiased scores.
    Tensor bias = tensor({8}, DType::f32, {0, 0, 0.5, 0.5, 0, 0, 0, 0});
    Tensor w2 = tensor({1, 2}, DType::f32, {}), ids2 = tensor({1, 2}, DType::i32, {});
    run_impl("grouped_topk", {w2.view(), ids2.view(), logits.view(), bias.view(), int64_t(2), true,
                                     int64_t(4), int64_t(1), std::string("sigmoid"), 1.0},
                    impl);
    EXPECT_EQ(values_of(ids2), (std::vector<double>{2, 3}));  // equal keys: the lower id first
    for (double v : values_of(w2)) EXPECT_NEAR(v, 0.5, 1e-7);
  }
}

// ---- quant ---------------------------------------------------------------------------------------
TEST(QuantChecks, RejectBadArguments) {
  Tensor x = tensor({2, 4}, DType::f32, std::vector<double>(8, 1.0));
  Tensor q = tensor({2, 4}, DType::f8e4m3, {}), s1 = tensor({1}, DType::f32, {}), s2 = tensor({2, 1}, DType::f32, {});
  Tensor good = tensor({1}, DType::f32, {0.5}), bad = tensor({1}, DType::f32, {0.0});
  const std::vector<const Tensor*> out = {&q, &s1, &s2};
  auto call = [&](const TensorView& qq, const TensorView& s, const Value& st, std::string mode, double ub) {
    return std::vector<Value>{qq, s, x.view(), st, mode, ub};
  };
  expect_rejected("quant_fp8", call(q, s1, None{}, "per_row", 0), "mode", out);
  expect_rejected("quant_fp8", call(q, s1, None{}, "static", 0), "static_scale", out);
  expect_rejected("quant_fp8", call(q, s1, good.view(), "per_tensor", 0), "static_scale", out);
  expect_rejected("quant_fp8", call(q, s1, bad.view(), "static", 0), "static_scale", out);
  expect_rejected("quant_fp8", call(q, s2, None{}, "per_tensor", 0), "scale", out);
  expect_rejected("quant_fp8", call(q, s1, None{}, "per_token", 0), "scale", out);
  expect_rejected("quant_fp8", call(tensor({2, 4}, DType::u8, {}), s1, None{}, "per_tensor", 0), "q", out);
  expect_rejected("quant_fp8", call(q, s2, None{}, "per_token", -1.0), "scale_ub", out);
  expect_rejected("quant_fp8", call(q, tensor({1}, DType::f16, {}), None{}, "per_tensor", 0), "scale", out);
}

TEST(QuantValues, ScalesAndBytes) {
  for (const char* impl : {"reference", "cpu"})
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(impl) + " " + dtype_name(dtype));
      const std::string policy = impl;
      // Row 0 amax 896 -> s = 2; row 1 amax 0 -> the minimum scale.
      Tensor x = tensor({2, 4}, dtype, {896, -448, 3, 0.0078125, 0, 0, 0, 0});
      Tensor q = tensor({2, 4}, DType::f8e4m3, {}), scale = tensor({1}, DType::f32, {});
      run_impl("quant_fp8", {q.view(), scale.view(), x.view(), None{}, std::string("per_tensor"), 0.0}, policy);
      EXPECT_EQ(values_of(scale)[0], 2.0);
      EXPECT_EQ(values_of(q), (std::vector<double>{448, -224, 1.5, 0.00390625, 0, 0, 0, 0}));
      Tensor token_scale = tensor({2, 1}, DType::f32, {});
      run_impl("quant_fp8", {q.view(), token_scale.view(), x.view(), None{}, std::string("per_token"), 448.0}, policy);
      EXPECT_EQ(values_of(token_scale), (std::vector<double>{1.0, double(kFp8MinScale)}));  // amax clamped to 448
      EXPECT_EQ(values_of(q)[0], 448);  // 896 saturates
      Tensor st = tensor({1}, DType::f32, {4.0});
      run_impl("quant_fp8", {q.view(), scale.view(), x.view(), st.view(), std::string("static"), 0.0}, policy);
      EXPECT_EQ(values_of(scale)[0], 4.0);
      EXPECT_EQ(values_of(q), (std::vector<double>{224, -112, 0.75, 0.001953125, 0, 0, 0, 0}));
    }
}

TEST(QuantValues, CpuMatchesReferenceBitForBit) {
  std::mt19937 gen(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t hidden : {1, 7, 33, 4097}) {
    std::vector<double> v(size_t(5 * hidden));
    for (double& e : v) e = normal(gen) * (gen() % 50 == 0 ? 30.0 : 1.0);
    for (DType dtype : {DType::f32, DType::bf16, DType::f16})
      for (std::string mode : {"per_tensor", "per_token"}) {
        SCOPED_TRACE(std::to_string(hidden) + " " + dtype_name(dtype) + " " + mode);
        Tensor x = tensor({5, hidden}, dtype, v);
        Shape scale_shape = mode == "per_token" ? Shape{5, 1} : Shape{1};
        Tensor q_ref = tensor({5, hidden}, DType::f8e4m3, {}), q_cpu = tensor({5, hidden}, DType::f8e4m3, {});
        Tensor s_ref = tensor(scale_shape, DType::f32, {}), s_cpu = tensor(scale_shape, DType::f32, {});
        run_impl("quant_fp8", {q_ref.view(), s_ref.view(), x.view(), None{}, mode, 0.0}, "reference");
        run_impl("quant_fp8", {q_cpu.view(), s_cpu.view(), x.view(), None{}, mode, 0.0}, "cpu");
        EXPECT_EQ(bytes_of_tensor(q_ref), bytes_of_tensor(q_cpu));
        EXPECT_EQ(bytes_of_tensor(s_ref), bytes_of_tensor(s_cpu));
      }
  }
}

}  // namespace
}  // namespace opforge
