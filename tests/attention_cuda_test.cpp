// CUDA kernels of attention_prefill and its backward, called directly on a GPU (skipped without
// one): the tensor-core and plain kernels agree with each other and with the reference on a packed
// batch whose 64-row tiles straddle sequences (an empty one included), every run gives the same
// bits, and offsets on the device that break the rules (the check cannot read them) are clamped:
// nothing is read out of bounds (run under compute-sanitizer) and every output is finite.
// attention_decode: the split kernels and the plain one agree with the reference over head_dim
// 64 / 128 / 256, groups of 4 and 3 and lengths around a split chunk, repeat runs give the same
// bits, and lengths on the device outside [0, max_ctx] are clamped.
// nothing is read out of bounds (run under compute-sanitizer) and every output is finite. With
// cuDNN (OPFORGE_WITH_CUDNN) the cudnn impls are checked against the plain kernels and timed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "opforge/registry.h"
#include "opforge/tensor.h"

#ifndef OPFORGE_WITH_CUDA

TEST(AttentionCuda, NeedsCuda) { GTEST_SKIP() << "opforge was built without CUDA"; }

#else

#include "backends/cuda/cuda_backend.h"
#include "ops/attention/attention_cuda.h"

namespace {

using namespace opforge;

const Device kGpu = Device::cuda(0);
const Context kGpuCtx{Device::cuda(0), Stream{}};
const Context kCpuCtx{};

#define REQUIRE_CUDA()                                              \
  do {                                                              \
    Availability a = cuda_availability();                           \
    if (!a.ok) GTEST_SKIP() << "CUDA unavailable: " << a.reason;    \
    (void)global_registry(); /* installs the device memory hooks */ \
  } while (0)

Tensor random_host(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < t.view().numel(); ++i) store_from_double(t.data(), dtype, i, normal(rng));
  return t;
}

Tensor offsets(const std::vector<int64_t>& cu, Device device) {
  Tensor t = Tensor::empty(Shape{int64_t(cu.size())}, DType::i64);
  std::memcpy(t.data(), cu.data(), cu.size() * sizeof(int64_t));
  return device.is_cpu() ? t : Tensor::copy_of(t.view(), device, DType::i64);
}

std::vector<double> values(const Tensor& t) {
  Tensor host = Tensor::copy_of(t.view(), Device::cpu(), t.view().dtype);
  std::vector<double> out(size_t(host.view().numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_double(host.data(), host.view().dtype, int64_t(i));
  return out;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
}

struct Problem {
  int64_t tokens, hq, hkv, d;
  std::vector<int64_t> cu;
  bool causal;
  int64_t window_left;
  DType dtype;
  Tensor q, k, v, dout;  // on the device
  Tensor qh, kh, vh, douth;  // on the host, f32

  Problem(std::vector<int64_t> cu_, int64_t hq_, int64_t hkv_, int64_t d_, bool causal_, int64_t wl, DType t)
      : tokens(cu_.back()), hq(hq_), hkv(hkv_), d(d_), cu(std::move(cu_)), causal(causal_), window_left(wl), dtype(t) {
    qh = random_host(Shape{tokens, hq, d}, dtype, 1);
    kh = random_host(Shape{tokens, hkv, d}, dtype, 2);
    vh = random_host(Shape{tokens, hkv, d}, dtype, 3);
    douth = random_host(Shape{tokens, hq, d}, dtype, 4);
    q = Tensor::copy_of(qh.view(), kGpu, dtype);
    k = Tensor::copy_of(kh.view(), kGpu, dtype);
    v = Tensor::copy_of(vh.view(), kGpu, dtype);
    dout = Tensor::copy_of(douth.view(), kGpu, dtype);
  }
};

using Forward = void (*)(const Context&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const TensorView&, const TensorView&, bool, double, int64_t);
using Backward = void (*)(const Context&, const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, const TensorView&, bool, double, int64_t);

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

Result run(const Problem& p, const Tensor& cu, Forward fwd, Backward bwd) {
  Tensor out = Tensor::empty(Shape{p.tokens, p.hq, p.d}, p.dtype, kGpu);
  Tensor lse = Tensor::empty(Shape{p.hq, p.tokens}, DType::f32, kGpu);
  Tensor dq = Tensor::empty(Shape{p.tokens, p.hq, p.d}, p.dtype, kGpu);
  Tensor dk = Tensor::empty(Shape{p.tokens, p.hkv, p.d}, p.dtype, kGpu);
  Tensor dv = Tensor::empty(Shape{p.tokens, p.hkv, p.d}, p.dtype, kGpu);
  fwd(kGpuCtx, out.view(), lse.view(), p.q.view(), p.k.view(), p.v.view(), cu.view(), p.causal, 0.0,
      p.window_left);
  bwd(kGpuCtx, dq.view(), dk.view(), dv.view(), p.dout.view(), p.q.view(), p.k.view(), p.v.view(),
      out.view(), lse.view(), cu.view(), p.causal, 0.0, p.window_left);
  return {values(out), values(lse), values(dq), values(dk), values(dv)};
}

TEST(AttentionCuda, TensorCoreAndPlainKernelsAgreeWithTheReference) {
  REQUIRE_CUDA();
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128})
      for (bool causal : {true, false}) {
        Problem p({0, 100, 100, 250, 300}, 8, 2, d, causal, causal ? 70 : -1, t);
        const Tensor cu = offsets(p.cu, kGpu);
        const Result fast = run(p, cu, attention_prefill_cuda_wmma, attention_prefill_backward_cuda_wmma);
        const Result again = run(p, cu, attention_prefill_cuda_wmma, attention_prefill_backward_cuda_wmma);
        const Result plain = run(p, cu, attention_prefill_cuda, attention_prefill_backward_cuda);
        // Double-buffered copies change when K and V arrive, not the math: the same bits.
        const Result async = run(p, cu, attention_prefill_cuda_wmma_async, attention_prefill_backward_cuda_wmma);
        EXPECT_EQ(async.out, fast.out);
        EXPECT_EQ(async.lse, fast.lse);
        EXPECT_EQ(fast.out, again.out);
        EXPECT_EQ(fast.dq, again.dq);
        EXPECT_EQ(fast.dk, again.dk);
        EXPECT_EQ(fast.dv, again.dv);
        // The reference forward in f64 on the host.
        Tensor out = Tensor::empty(Shape{p.tokens, p.hq, p.d}, DType::f64);
        Tensor lse = Tensor::empty(Shape{p.hq, p.tokens}, DType::f64);
        Tensor q64 = Tensor::copy_of(p.qh.view(), Device::cpu(), DType::f64);
        Tensor k64 = Tensor::copy_of(p.kh.view(), Device::cpu(), DType::f64);
        Tensor v64 = Tensor::copy_of(p.vh.view(), Device::cpu(), DType::f64);
        const Tensor cu_host = offsets(p.cu, Device::cpu());
        attention_prefill_reference(kCpuCtx, out.view(), lse.view(), q64.view(), k64.view(), v64.view(),
                                    cu_host.view(), p.causal, 0.0, p.window_left);
        const double tol = t == DType::bf16 ? 0.03 : 0.01;
        expect_close(fast.out, values(out), tol, "wmma out vs reference");
        expect_close(plain.out, values(out), tol, "plain out vs reference");
        expect_close(fast.lse, values(lse), 1e-3, "wmma lse vs reference");
        expect_close(plain.lse, values(lse), 1e-3, "plain lse vs reference");
        expect_close(fast.dq, plain.dq, 4 * tol, "dq wmma vs plain");
        expect_close(fast.dk, plain.dk, 4 * tol, "dk wmma vs plain");
        expect_close(fast.dv, plain.dv, 4 * tol, "dv wmma vs plain");
      }
}

TEST(AttentionCuda, OffsetsOnTheDeviceAreClamped) {
  REQUIRE_CUDA();
  // Decreasing, negative and past-the-end offsets: the check cannot see them on the device.
  Problem p({0, 200}, 4, 2, 64, true, -1, DType::bf16);
  const Tensor bad = offsets({-7, 150, 40, 999, 120}, kGpu);
  const Forward forwards[] = {attention_prefill_cuda, attention_prefill_cuda_wmma, attention_prefill_cuda_wmma_async};
  for (int f = 0; f < 3; ++f) {
    const Result r = run(p, bad, forwards[f], f == 0 ? attention_prefill_backward_cuda : attention_prefill_backward_cuda_wmma);
    for (const std::vector<double>* v : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv})
      for (double x : *v) ASSERT_TRUE(std::isfinite(x)) << "kernel set " << f;
  }
}

// ---- attention_decode: the split kernels (cuda_decode.cu) -------------------------------------
Tensor lengths(const std::vector<int32_t>& lens, Device device) {
  Tensor t = Tensor::empty(Shape{int64_t(lens.size())}, DType::i32);
  if (!lens.empty()) std::memcpy(t.data(), lens.data(), lens.size() * sizeof(int32_t));
  return device.is_cpu() ? t : Tensor::copy_of(t.view(), device, DType::i32);
}

using Decode = void (*)(const Context&, const TensorView&, const TensorView&, const TensorView&,
                        const TensorView&, const TensorView&, double);

struct DecodeProblem {
  int64_t batch, max_ctx, hq, hkv, d;
  DType dtype;
  Tensor q, kc, vc;     // on the device
  Tensor qh, kh, vh;    // on the host

  DecodeProblem(int64_t b, int64_t ctx, int64_t hq_, int64_t hkv_, int64_t d_, DType t)
      : batch(b), max_ctx(ctx), hq(hq_), hkv(hkv_), d(d_), dtype(t) {
    qh = random_host(Shape{b, hq, d}, t, 11);
    kh = random_host(Shape{b, ctx, hkv, d}, t, 12);
    vh = random_host(Shape{b, ctx, hkv, d}, t, 13);
    q = Tensor::copy_of(qh.view(), kGpu, t);
    kc = Tensor::copy_of(kh.view(), kGpu, t);
    vc = Tensor::copy_of(vh.view(), kGpu, t);
  }
  std::vector<double> run(Decode fn, const Tensor& lens) const {
    Tensor out = Tensor::empty(Shape{batch, hq, d}, dtype, kGpu);
    fn(kGpuCtx, out.view(), q.view(), kc.view(), vc.view(), lens.view(), 0.0);
    return values(out);
  }
  // The reference in f64 on the host with lengths that obey the op's rules.
  std::vector<double> reference(const std::vector<int32_t>& lens) const {
    Tensor out = Tensor::empty(Shape{batch, hq, d}, DType::f64);
    Tensor q64 = Tensor::copy_of(qh.view(), Device::cpu(), DType::f64);
    Tensor k64 = Tensor::copy_of(kh.view(), Device::cpu(), DType::f64);
    Tensor v64 = Tensor::copy_of(vh.view(), Device::cpu(), DType::f64);
    const Tensor l = lengths(lens, Device::cpu());
    attention_decode_reference(kCpuCtx, out.view(), q64.view(), k64.view(), v64.view(), l.view(), 0.0);
    return values(out);
  }
};

TEST(AttentionCuda, DecodeSplitKernelsAgreeWithTheReference) {
  REQUIRE_CUDA();
  // Lengths inside, at and one past a split chunk, 1, 0 and the full cache; group 4 and 3.
  const std::vector<int32_t> lens = {1000, 1, 0, 517, 64, 65};
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128, 256})
      for (int64_t hq : {8, 6}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " d " + std::to_string(d) + " hq " + std::to_string(hq));
        DecodeProblem p(int64_t(lens.size()), 1000, hq, 2, d, t);
        ASSERT_EQ(attention_decode_cuda_split_applicable(p.q.view(), p.q.view(), p.kc.view(),
                                                         p.vc.view(), lengths(lens, kGpu).view(), 0.0),
                  nullptr);
        const Tensor dl = lengths(lens, kGpu);
        const std::vector<double> split = p.run(attention_decode_cuda_split, dl);
        const std::vector<double> again = p.run(attention_decode_cuda_split, dl);
        const std::vector<double> async = p.run(attention_decode_cuda_split_async, dl);
        const std::vector<double> async2 = p.run(attention_decode_cuda_split_async, dl);
        const std::vector<double> plain = p.run(attention_decode_cuda, dl);
        EXPECT_EQ(split, again);  // fixed-order combination: the same bits run after run
        EXPECT_EQ(async, async2);
        const std::vector<double> want = p.reference(lens);
        const double tol = t == DType::bf16 ? 0.03 : 0.01;
        expect_close(split, want, tol, "cuda_split vs reference");
        expect_close(async, want, tol, "cuda_split_async vs reference");
        expect_close(plain, want, tol, "cuda vs reference");
      }
}

TEST(AttentionCuda, DecodeLengthsOnTheDeviceAreClamped) {
  REQUIRE_CUDA();
  // Negative and past-the-cache lengths: the check cannot see them on the device; the kernels
  // clamp them to [0, max_ctx], so they equal lengths 0 and max_ctx.
  DecodeProblem p(3, 300, 8, 2, 128, DType::bf16);
  const Tensor bad = lengths({-5, 100000, 7}, kGpu);
  const std::vector<double> want = p.reference({0, 300, 7});
  for (Decode fn : {attention_decode_cuda_split, attention_decode_cuda_split_async, attention_decode_cuda}) {
    const std::vector<double> got = p.run(fn, bad);
    for (double x : got) ASSERT_TRUE(std::isfinite(x));
    expect_close(got, want, 0.03, "clamped lengths vs reference");
  }
}
#ifdef OPFORGE_WITH_CUDNN
// The cudnn impls (cuDNN's fused attention) against the plain kernels on the same straddling batch
// with GQA; then the issue's shape (8k tokens, causal, 32 query / 8 kv heads of 128, bf16): its
// calls capture into a CUDA graph (no host synchronization, no allocation once warm) and the
// throughput is printed beside the tensor-core kernel's.
bool cudnn_usable(const Problem& p, const Tensor& cu, const Tensor& out, const Tensor& lse) {
  Availability a = cuda_availability();
  for (const OpEntry* op : global_registry().ops())
    if (op->name == "attention_prefill")
      for (const KernelEntry& k : op->kernels)
        if (k.impl() == "cudnn") a = k.availability();
  if (!a.ok) {
    std::printf("cudnn impl unavailable: %s\n", a.reason.c_str());
    return false;
  }
  const char* why = attention_prefill_cudnn_applicable(out.view(), lse.view(), p.q.view(), p.k.view(), p.v.view(),
                                                       cu.view(), p.causal, 0.0, p.window_left);
  if (why) ADD_FAILURE() << "cudnn declines " << p.tokens << " tokens, window " << p.window_left << ": " << why;
  return why == nullptr;
}

TEST(AttentionCuda, CudnnAgreesWithThePlainKernels) {
  REQUIRE_CUDA();
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128})
      for (bool causal : {true, false}) {
        Problem p({0, 100, 100, 250, 300}, 8, 2, d, causal, causal ? 70 : -1, t);
        const Tensor cu = offsets(p.cu, kGpu);
        Tensor out = Tensor::empty(Shape{p.tokens, p.hq, p.d}, p.dtype, kGpu);
        Tensor lse = Tensor::empty(Shape{p.hq, p.tokens}, DType::f32, kGpu);
        if (!cudnn_usable(p, cu, out, lse)) return;
        const Result fast = run(p, cu, attention_prefill_cudnn, attention_prefill_backward_cudnn);
        const Result plain = run(p, cu, attention_prefill_cuda, attention_prefill_backward_cuda);
        const double tol = t == DType::bf16 ? 0.03 : 0.01;
        expect_close(fast.out, plain.out, tol, "cudnn out vs plain");
        expect_close(fast.lse, plain.lse, 1e-3, "cudnn lse vs plain");
        expect_close(fast.dq, plain.dq, 4 * tol, "cudnn dq vs plain");
        expect_close(fast.dk, plain.dk, 4 * tol, "cudnn dk vs plain");
        expect_close(fast.dv, plain.dv, 4 * tol, "cudnn dv vs plain");
      }
}

TEST(AttentionCuda, CudnnCapturesAndTimesTheIssueShape) {
  REQUIRE_CUDA();
  Problem p({0, 8192}, 32, 8, 128, true, -1, DType::bf16);
  const Tensor cu = offsets(p.cu, kGpu);
  Tensor out = Tensor::empty(Shape{p.tokens, p.hq, p.d}, p.dtype, kGpu);
  Tensor lse = Tensor::empty(Shape{p.hq, p.tokens}, DType::f32, kGpu);
  if (!cudnn_usable(p, cu, out, lse)) return;
  auto call = [&](Forward f) {
    return [&, f] { f(kGpuCtx, out.view(), lse.view(), p.q.view(), p.k.view(), p.v.view(), cu.view(), true, 0.0, -1); };
  };
  const std::function<void()> cudnn = call(attention_prefill_cudnn), wmma = call(attention_prefill_cuda_wmma_async);
  cudnn();  // builds the plan and grows the workspace outside the capture
  const double flops = 2.0 * double(p.tokens) * double(p.tokens) * double(p.hq) * double(p.d);  // causal: half of 4 T^2 Hq D
  const double graph_us = cuda_graph_median_us(0, cudnn, 5, 5);
  EXPECT_GE(graph_us, 0.0) << "the cudnn forward could not be captured (it synchronizes or allocates)";
  const double cudnn_us = cuda_median_us(0, cudnn, 3, 10);
  const double wmma_us = cuda_median_us(0, wmma, 3, 10);
  std::printf("attention_prefill 8192 tokens causal 32/8 x 128 bf16: cudnn %.1f us (%.0f TFLOP/s, graph %.1f us), "
              "cuda_wmma2 %.1f us (%.0f TFLOP/s)\n",
              cudnn_us, flops / cudnn_us * 1e-6, graph_us, wmma_us, flops / wmma_us * 1e-6);
}
#endif  // OPFORGE_WITH_CUDNN

}  // namespace

#endif
