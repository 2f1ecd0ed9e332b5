// The rms variants of the norm family (ops/norm/variants.cpp): gemma_rms_norm,
// gemma_fused_add_rms_norm, rms_norm_gated, poly_norm and their backward ops. Argument checks
// (the error names the argument; a rejected call writes nothing), hand-computed values, the
// relations to rms_norm, the cpu kernels against the reference, deterministic reductions. The
// harness (opforge check) covers the cases of ops/norm/cases*.cpp on top of this.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_info.h"
#include "backends/cpu/tiling.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "ops/layernorm/internal.h"
#include "ops/norm/internal.h"
#include "tests/test_util.h"

namespace opforge {
namespace {

using test_util::at;
using test_util::rtol_of;
using test_util::expect_arg_error;

const Context kCtx{};

Tensor make(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  std::memset(t.data(), 0x7b, size_t(t.nbytes()));  // a sentinel, so unwritten bytes show
  return t;
}

// N(0, 1) with ~1% outliers (as the harness), or U(lo, hi) when `uniform`.
Tensor random(const Shape& shape, DType dtype, uint32_t seed, bool uniform = false, double lo = 0.5,
              double hi = 1.5) {
  Tensor t = make(shape, dtype);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = uniform ? lo + (hi - lo) * u01(gen) : normal(gen);
    if (!uniform && u01(gen) < 0.01) v *= 8 + 24 * u01(gen);
    store_from_double(t.data(), dtype, i, v);
  }
  return t;
}

Tensor values(const Shape& shape, DType dtype, const std::vector<double>& v) {
  Tensor t = make(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) store_from_double(t.data(), dtype, int64_t(i), v[i]);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), size_t(a.nbytes())) == 0;
}

// |a - r| <= rtol * (|r| + 1e-3 max|r|) elementwise.
void expect_close(const TensorView& a, const TensorView& r, double rtol) {
  double max_ref = 0;
  for (int64_t i = 0; i < r.numel(); ++i) max_ref = std::max(max_ref, std::abs(at(r, i)));
  for (int64_t i = 0; i < r.numel(); ++i)
    ASSERT_LE(std::abs(at(a, i) - at(r, i)), rtol * (std::abs(at(r, i)) + 1e-3 * max_ref))
        << "element " << i << ": got " << at(a, i) << ", reference " << at(r, i);
}

// ---- checks ------------------------------------------------------------------------------------
TEST(NormVariantChecks, GemmaRejectsBadArguments) {
  Tensor x = random({4, 64}, DType::bf16, 1), w = random({64}, DType::bf16, 2, true, -0.5, 0.5);
  Tensor y = make({4, 64}, DType::bf16), r = random({4, 64}, DType::bf16, 3);
  Tensor s = make({4, 64}, DType::bf16);
  EXPECT_NO_THROW(GemmaRmsNorm::check(y, x, w, 1e-6));
  EXPECT_NO_THROW(GemmaRmsNorm::check(x, x, w, 1e-6));
  expect_arg_error([&] { GemmaRmsNorm::check(y, x, make({63}, DType::bf16), 1e-6); }, "w",
                   "gemma_rms_norm: argument 'w': expected shape [64], got [63]");
  expect_arg_error([&] { GemmaRmsNorm::check(y, x, w, -1.0); }, "eps", "gemma_rms_norm");
  expect_arg_error([&] { GemmaRmsNorm::check(make({4, 64}, DType::f32), x, w, 1e-6); }, "y",
                   "dtype bf16");
  EXPECT_NO_THROW(GemmaFusedAddRmsNorm::check(x, r, x, r, w, 1e-6));  // in place
  expect_arg_error([&] { GemmaFusedAddRmsNorm::check(y, x, x, r, w, 1e-6); }, "s",
                   "no overlap with 'x'");
  Tensor dx = make({4, 64}, DType::bf16), dw = make({64}, DType::bf16);
  expect_arg_error([&] { GemmaRmsNormBackward::check(dx, make({65}, DType::bf16), y, x, w, 1e-6); },
                   "dw", "gemma_rms_norm_backward");
  expect_arg_error(
      [&] { GemmaFusedAddRmsNormBackward::check(dx, s, dw, y, s, x, r, w, 1e-6); }, "dresidual",
      "no overlap with 'ds'");
}

TEST(NormVariantChecks, GatedRejectsBadArguments) {
  Tensor x = random({3, 48}, DType::f32, 1), z = random({3, 48}, DType::f32, 2);
  Tensor w = random({48}, DType::f32, 3, true), y = make({3, 48}, DType::f32);
  auto check = [&](const TensorView& y, const TensorView& z, int64_t group, std::string_view act) {
    RmsNormGated::check(y, x, z, w, 1e-5, group, false, act);
  };
  EXPECT_NO_THROW(check(y, z, 0, "silu"));
  EXPECT_NO_THROW(check(y, z, 16, "swish"));
  EXPECT_NO_THROW(check(x, z, 48, "sigmoid"));  // in place over x
  expect_arg_error([&] { check(y, z, 5, "silu"); }, "group_size",
                   "rms_norm_gated: argument 'group_size': expected 0 (whole last dim) or a "
                   "positive divisor of hidden = 48, got 5");
  expect_arg_error([&] { check(y, z, -16, "silu"); }, "group_size", "got -16");
  expect_arg_error([&] { check(y, z, 0, "gelu"); }, "activation", "got 'gelu'");
  expect_arg_error([&] { check(y, make({3, 47}, DType::f32), 0, "silu"); }, "z", "shape");
  expect_arg_error([&] { check(z, z, 0, "silu"); }, "y", "no overlap with 'z'");
  expect_arg_error([&] { RmsNormGated::check(y, x, z, w, NAN, 0, false, "silu"); }, "eps");
  Tensor dy = random({3, 48}, DType::f32, 4), dx = make({3, 48}, DType::f32);
  Tensor dz = make({3, 48}, DType::f32), dw = make({48}, DType::f32);
  EXPECT_NO_THROW(RmsNormGatedBackward::check(dx, dz, dw, dy, x, z, w, 1e-5, 12, true, "silu"));
  expect_arg_error(
      [&] { RmsNormGatedBackward::check(dx, dx, dw, dy, x, z, w, 1e-5, 0, true, "silu"); }, "dz",
      "no overlap with 'dx'");
  expect_arg_error(
      [&] { RmsNormGatedBackward::check(dx, dz, dw, dy, x, z, w, 1e-5, 7, true, "silu"); },
      "group_size");
  expect_arg_error(
      [&] { RmsNormGatedBackward::check(dx, dz, dw, dy, x, z, w, 1e-5, 0, true, "tanh"); },
      "activation");
}

TEST(NormVariantChecks, PolyRejectsBadArguments) {
  Tensor x = random({3, 40}, DType::f16, 1), w = random({3}, DType::f16, 2, true);
  Tensor b = random({1}, DType::f16, 3), y = make({3, 40}, DType::f16);
  EXPECT_NO_THROW(PolyNorm::check(y, x, w, b, 1e-6));
  EXPECT_NO_THROW(PolyNorm::check(x, x, w, b, 1e-6));
  expect_arg_error([&] { PolyNorm::check(y, x, make({4}, DType::f16), b, 1e-6); }, "w",
                   "poly_norm: argument 'w': expected shape [3], got [4]");
  expect_arg_error([&] { PolyNorm::check(y, x, w, make({2}, DType::f16), 1e-6); }, "b",
                   "expected shape [1]");
  expect_arg_error([&] { PolyNorm::check(y, x, w, make({1}, DType::f32), 1e-6); }, "b",
                   "dtype f16");
  expect_arg_error([&] { PolyNorm::check(y, x, w, b, -1e-6); }, "eps");
  expect_arg_error([&] { PolyNorm::check(y, make({3, 40}, DType::i32), w, b, 1e-6); }, "x");
  Tensor dy = random({3, 40}, DType::f16, 4), dx = make({3, 40}, DType::f16);
  Tensor dw = make({3}, DType::f16), db = make({1}, DType::f16);
  EXPECT_NO_THROW(PolyNormBackward::check(dx, dw, db, dy, x, w, 1e-6));
  expect_arg_error([&] { PolyNormBackward::check(dx, dw, make({3}, DType::f16), dy, x, w, 1e-6); },
                   "db", "expected shape [1]");
  expect_arg_error([&] { PolyNormBackward::check(dy, dw, db, dy, x, w, 1e-6); }, "dx",
                   "no overlap with 'dy'");
}

// Through the registry's boxed call: a rejected call writes nothing.
TEST(NormVariantChecks, RejectedCallsLeaveOutputsUntouched) {
  Registry reg;
  register_norm(reg);
  Tensor x = random({4, 64}, DType::f32, 1), z = random({4, 64}, DType::f32, 2);
  Tensor w = random({64}, DType::f32, 3, true), w3 = random({3}, DType::f32, 4, true);
  Tensor b = random({1}, DType::f32, 5), y = make({4, 64}, DType::f32);
  const std::vector<std::pair<std::string, std::vector<Value>>> calls = {
      {"gemma_rms_norm", {y.view(), x.view(), w.view(), -1.0}},
      {"rms_norm_gated", {y.view(), x.view(), z.view(), w.view(), 1e-5, int64_t(7), false,
                          std::string("silu")}},
      {"rms_norm_gated", {y.view(), x.view(), z.view(), w.view(), 1e-5, int64_t(0), false,
                          std::string("relu")}},
      {"poly_norm", {y.view(), x.view(), w.view(), b.view(), 1e-6}},
      {"poly_norm", {y.view(), x.view(), w3.view(), b.view(), NAN}},
  };
  for (const auto& [op, args] : calls) {
    SCOPED_TRACE(op);
    const std::vector<unsigned char> before(static_cast<unsigned char*>(y.data()),
                                            static_cast<unsigned char*>(y.data()) + y.nbytes());
    EXPECT_THROW(reg.call(op, args), Error);
    EXPECT_EQ(std::memcmp(before.data(), y.data(), size_t(y.nbytes())), 0);
  }
}

// ---- values ------------------------------------------------------------------------------------
TEST(NormVariantValues, GemmaIsRmsNormWithOffsetOne) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    Tensor x = random({5, 67}, t, 1), r = random({5, 67}, t, 2);
    Tensor w = random({67}, t, 3, true, -0.5, 0.5);
    Tensor a = make({5, 67}, t), b = make({5, 67}, t), sa = make({5, 67}, t), sb = make({5, 67}, t);
    Registry reg;
    register_norm(reg);
    reg.call("gemma_rms_norm", std::vector<Value>{a.view(), x.view(), w.view(), 1e-6});  // cpu
    rms_norm_cpu(kCtx, b, x, w, 1e-6, 1.0);
    EXPECT_TRUE(same_bytes(a, b)) << dtype_name(t);
    reg.call("gemma_fused_add_rms_norm",
             std::vector<Value>{a.view(), sa.view(), x.view(), r.view(), w.view(), 1e-6});
    fused_add_rms_norm_reference(kCtx, b, sb, x, r, w, 1e-6, 1.0);
    expect_close(a, b, rtol_of(t, 5e-5));
    EXPECT_TRUE(same_bytes(sa, sb)) << dtype_name(t);  // s = x + residual, rounded once
  }
}

// 1 x 4 row, hand-computed: x = [1, 2, 3, 4], z = 0 gives silu 0, sigmoid 1/2.
TEST(NormVariantValues, GatedHandExample) {
  Tensor x = values({1, 4}, DType::f64, {1, 2, 3, 4}), z = values({1, 4}, DType::f64, {0, 0, 0, 0});
  Tensor w = values({4}, DType::f64, {1, 1, 1, 1}), y = make({1, 4}, DType::f64);
  // Norm first, sigmoid gate: y = x / sqrt(7.5) / 2.
  rms_norm_gated_reference(kCtx, y, x, z, w, 0.0, 0, true, "sigmoid");
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(at(y, i), (i + 1) / std::sqrt(7.5) / 2, 1e-12);
  // Groups of 2 ([1, 2] and [3, 4]), no gate effect from z = 0 with silu-after: u = 0 -> y = 0.
  rms_norm_gated_reference(kCtx, y, x, z, w, 1e-5, 2, false, "silu");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(at(y, i), 0.0);
  // Groups of 2, norm first, sigmoid: [1, 2] / sqrt(2.5) / 2, [3, 4] / sqrt(12.5) / 2.
  rms_norm_gated_reference(kCtx, y, x, z, w, 0.0, 2, true, "sigmoid");
  EXPECT_NEAR(at(y, 0), 1 / std::sqrt(2.5) / 2, 1e-12);
  EXPECT_NEAR(at(y, 3), 4 / std::sqrt(12.5) / 2, 1e-12);
}

// x = [c, -c]: mean(x^2p) = c^(2p), so N(x^p) = sign(x)^p (eps = 0) and
// y = w0 sign^3 + w1 + w2 sign + b.
TEST(NormVariantValues, PolyHandExample) {
  Tensor x = values({1, 2}, DType::f64, {3, -3}), w = values({3}, DType::f64, {0.5, 2, 4});
  Tensor b = values({1}, DType::f64, {0.25}), y = make({1, 2}, DType::f64);
  poly_norm_reference(kCtx, y, x, w, b, 0.0);
  EXPECT_NEAR(at(y, 0), 0.5 + 2 + 4 + 0.25, 1e-12);
  EXPECT_NEAR(at(y, 1), -0.5 + 2 - 4 + 0.25, 1e-12);
}

// ---- cpu kernels --------------------------------------------------------------------------------
TEST(NormVariantCpu, GatedMatchesReference) {
  struct Config { int64_t group; bool norm_first; const char* act; };
  for (const Config& c : {Config{0, false, "silu"}, Config{16, true, "sigmoid"},
                          Config{24, false, "swish"}, Config{0, true, "silu"}}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " group " + std::to_string(c.group) + " " + c.act);
      Tensor x = random({5, 96}, t, 1), z = random({5, 96}, t, 2), w = random({96}, t, 3, true);
      Tensor y = make({5, 96}, t), ref = make({5, 96}, t);
      rms_norm_gated_cpu(kCtx, y, x, z, w, 1e-5, c.group, c.norm_first, c.act);
      rms_norm_gated_reference(kCtx, ref, x, z, w, 1e-5, c.group, c.norm_first, c.act);
      expect_close(y, ref, rtol_of(t, 5e-5));
    }
  }
}

TEST(NormVariantCpu, PolyMatchesReference) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor x = random({6, 131}, t, 1), w = random({3}, t, 2, true), b = random({1}, t, 3);
    Tensor y = make({6, 131}, t), ref = make({6, 131}, t);
    poly_norm_cpu(kCtx, y, x, w, b, 1e-6);
    poly_norm_reference(kCtx, ref, x, w, b, 1e-6);
    expect_close(y, ref, rtol_of(t, 5e-5));
  }
}

// dw / db do not depend on the thread count.
TEST(NormVariantCpu, BackwardReductionsAreDeterministic) {
  const Shape shape{300, 96};  // several reduction chunks on any cache size
  Tensor x = random(shape, DType::f32, 1), z = random(shape, DType::f32, 2);
  Tensor dy = random(shape, DType::f32, 3), w = random({96}, DType::f32, 4, true);
  Tensor w3 = random({3}, DType::f32, 5, true);
  std::vector<Tensor> gated, poly_w, poly_b;
  for (int threads : {1, 2, 3}) {
    const int saved = cpu::set_thread_count_for_testing(threads);
    Tensor dx = make(shape, DType::f32), dz = make(shape, DType::f32), dw = make({96}, DType::f32);
    rms_norm_gated_backward_cpu(kCtx, dx, dz, dw, dy, x, z, w, 1e-5, 32, false, "silu");
    gated.push_back(dw);
    Tensor pdw = make({3}, DType::f32), pdb = make({1}, DType::f32);
    poly_norm_backward_cpu(kCtx, dx, pdw, pdb, dy, x, w3, 1e-6);
    poly_w.push_back(pdw);
    poly_b.push_back(pdb);
    cpu::set_thread_count_for_testing(saved);
  }
  for (size_t i = 1; i < gated.size(); ++i) {
    EXPECT_TRUE(same_bytes(gated[i], gated[0]));
    EXPECT_TRUE(same_bytes(poly_w[i], poly_w[0]));
    EXPECT_TRUE(same_bytes(poly_b[i], poly_b[0]));
  }
}

// Calls larger than the last-level cache write with non-temporal stores (Note [streaming
// stores]); their rows must be bit-identical to a small call's (plain stores) on the same rows.
TEST(NormCpu, StreamingStoresMatchPlainStores) {
  const int64_t hidden = 1024;
  // Streaming starts past the L3 at the latest (Note [streaming stores]); a 1 MiB L3 stands in
  // for this machine's, so the big calls stream and the 4-row ones do not whatever it reports
  // (480 MiB on a VM that reports its host's would make the big tensors take minutes under ASan).
  const int64_t threshold = int64_t(1) << 20;
  const int64_t saved = cpu::set_l3_bytes_for_testing(threshold);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t rows = threshold / (hidden * dtype_size(t)) + 8;
    const Shape big{rows, hidden}, small{4, hidden};
    Tensor x = random(big, t, 1), r = random(big, t, 2), dy = random(big, t, 3);
    Tensor ds = random(big, t, 4), w = random({hidden}, t, 5, true);
    auto head = [&](const Tensor& src) {  // the first 4 rows as their own tensor
      Tensor h = make(small, t);
      std::memcpy(h.data(), src.data(), size_t(h.nbytes()));
      return h;
    };
    Tensor xs = head(x), rs = head(r), dys = head(dy), dss = head(ds);
    Tensor y = make(big, t), s = make(big, t), ys = make(small, t), ss = make(small, t);
    rms_norm_cpu(kCtx, y, x, w, 1e-6, 0.0);
    rms_norm_cpu(kCtx, ys, xs, w, 1e-6, 0.0);
    EXPECT_TRUE(same_bytes(head(y), ys));
    fused_add_rms_norm_cpu(kCtx, y, s, x, r, w, 1e-6, 1.0);
    fused_add_rms_norm_cpu(kCtx, ys, ss, xs, rs, w, 1e-6, 1.0);
    EXPECT_TRUE(same_bytes(head(y), ys));
    EXPECT_TRUE(same_bytes(head(s), ss));
    Tensor dw = make({hidden}, t), dws = make({hidden}, t);
    rms_norm_backward_cpu(kCtx, y, dw, dy, x, w, 1e-6, 0.0);
    rms_norm_backward_cpu(kCtx, ys, dws, dys, xs, w, 1e-6, 0.0);
    EXPECT_TRUE(same_bytes(head(y), ys));
    fused_add_rms_norm_backward_cpu(kCtx, y, s, dw, dy, ds, x, r, w, 1e-6, 0.0);
    fused_add_rms_norm_backward_cpu(kCtx, ys, ss, dws, dys, dss, xs, rs, w, 1e-6, 0.0);
    EXPECT_TRUE(same_bytes(head(y), ys));
    EXPECT_TRUE(same_bytes(head(s), ss));
    Tensor db = make({hidden}, t), dbs = make({hidden}, t);  // layer_norm_backward streams dx too
    layer_norm_backward_cpu(kCtx, y, dw, db, dy, x, w, 1e-5);
    layer_norm_backward_cpu(kCtx, ys, dws, dbs, dys, xs, w, 1e-5);
    EXPECT_TRUE(same_bytes(head(y), ys));
    // group_norm over the same bytes as [rows, 8 channels, 128]: 4 groups of 2 channels a row
    Tensor gw = random({8}, t, 6, true), gb = random({8}, t, 7);
    group_norm_cpu(kCtx, TensorView(y.data(), t, Shape{rows, 8, 128}), TensorView(x.data(), t, Shape{rows, 8, 128}),
                   gw, gb, 4, 1e-5);
    group_norm_cpu(kCtx, TensorView(ys.data(), t, Shape{4, 8, 128}), TensorView(xs.data(), t, Shape{4, 8, 128}),
                   gw, gb, 4, 1e-5);
    EXPECT_TRUE(same_bytes(head(y), ys));
    // poly_norm_backward streams dx
    Tensor pw = random({3}, t, 11, true), pdw = make({3}, t), pdb = make({1}, t), pdws = make({3}, t), pdbs = make({1}, t);
    poly_norm_backward_cpu(kCtx, y, pdw, pdb, dy, x, pw, 1e-6);
    poly_norm_backward_cpu(kCtx, ys, pdws, pdbs, dys, xs, pw, 1e-6);
    EXPECT_TRUE(same_bytes(head(y), ys));
    // rms_norm_gated over rows of 1,056 (64-byte aligned in every dtype): groups of 24 (48 or 96
    // bytes) start on and off the vector boundary, so whole vectors take both kinds of store;
    // groups of the whole row stream every whole vector.
    const int64_t gh = 1056, grows = threshold / (gh * dtype_size(t)) + 8;
    Tensor gx = random({grows, gh}, t, 8), gz = random({grows, gh}, t, 9), gwt = random({gh}, t, 10, true);
    Tensor gy = make({grows, gh}, t), gxs = make({4, gh}, t), gzs = make({4, gh}, t), gys = make({4, gh}, t);
    std::memcpy(gxs.data(), gx.data(), size_t(gxs.nbytes()));
    std::memcpy(gzs.data(), gz.data(), size_t(gzs.nbytes()));
    for (int64_t group : {int64_t(24), int64_t(0)})
      for (bool norm_first : {false, true}) {
        SCOPED_TRACE("rms_norm_gated group " + std::to_string(group) + (norm_first ? " norm first" : ""));
        rms_norm_gated_cpu(kCtx, gy, gx, gz, gwt, 1e-5, group, norm_first, "silu");
        rms_norm_gated_cpu(kCtx, gys, gxs, gzs, gwt, 1e-5, group, norm_first, "silu");
        Tensor gyh = make({4, gh}, t);
        std::memcpy(gyh.data(), gy.data(), size_t(gyh.nbytes()));
        EXPECT_TRUE(same_bytes(gyh, gys));
      }
  }
  cpu::set_l3_bytes_for_testing(saved);
}

// Note [streaming stores]: outputs stream past the cache share (the L3, at most
// kStreamBytesPerThread a thread) or when the call moves more than the whole L3; never when an
// output row is not 64-byte aligned. Views over a fake aligned address: only the decision runs.
TEST(NormCpu, StreamingRuleUsesTheCacheShare) {
  if (std::getenv("OPFORGE_CPU_STREAM_BYTES") != nullptr) GTEST_SKIP() << "the share is overridden";
  // A VM reporting a huge L3 (its host's: 480 MiB on the 2-core Xeon); 64 GiB, so that the share
  // is the threads' and a call moving twice it stays under the whole L3 on any thread count.
  const int64_t l3 = int64_t(64) << 30;
  const int64_t saved = cpu::set_l3_bytes_for_testing(l3);
  const int64_t share = cpu::stream_bytes();
  EXPECT_LE(share, l3 / 2);
  EXPECT_GE(share, cpu::kStreamBytesPerThread);  // one thread's share at least
  EXPECT_EQ(share % cpu::kStreamBytesPerThread, 0);  // whole threads' shares, under that L3
  void* fake = reinterpret_cast<void*>(uintptr_t(1) << 20);
  auto rows_of = [](int64_t bytes) { return bytes / (4096 * 2); };  // bf16 rows of hidden 4096
  const TensorView over(fake, DType::bf16, Shape{rows_of(share) + 1, 4096}, Device::cpu());
  const TensorView under(fake, DType::bf16, Shape{rows_of(share), 4096}, Device::cpu());
  EXPECT_TRUE(cpu::stream_outputs(2.0 * double(share), {&over}));
  EXPECT_FALSE(cpu::stream_outputs(2.0 * double(share), {&under}));
  EXPECT_TRUE(cpu::stream_outputs(double(l3 + (int64_t(1) << 20)), {&under}));  // past the whole L3
  const TensorView odd(fake, DType::bf16, Shape{rows_of(share) + 1, 4100}, Device::cpu());  // 8200-byte rows
  EXPECT_FALSE(cpu::stream_outputs(2.0 * double(share), {&odd}));
  cpu::set_l3_bytes_for_testing(int64_t(1) << 20);  // a small L3 bounds the share
  EXPECT_EQ(cpu::stream_bytes(), int64_t(1) << 20);
  cpu::set_l3_bytes_for_testing(saved);
}

}  // namespace
}  // namespace opforge
