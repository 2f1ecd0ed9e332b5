// The bandwidth-first CUDA kernels (layer_norm cuda_vec16_rowblock, layer_norm_backward
// cuda_vec16_async, quant_fp8 cuda_vec16_coop) against the cuda_vec16 kernels they sit above, on
// shapes the harness's test mode does not reach (its large group): 16384 rows, several rows per
// block, several steps per block. The coop quantizer must match cuda_vec16 bit for bit (both are
// bit-exact with the reference); the layer_norm kernels must agree within the dtype's tolerance and
// give the same bits run after run. fused_linear_cross_entropy's extra device memory at the
// training shape of Llama-3's head is measured (not planned) on a stream of its own. Skips with the
// probe's reason when no usable CUDA device is present.
#include <gtest/gtest.h>

#ifndef OPFORGE_WITH_CUDA

TEST(CudaMembw, NeedsCuda) { GTEST_SKIP() << "opforge was built without CUDA"; }

#else

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "backends/cuda/cuda_backend.h"
#include "ops/layernorm/layernorm_cuda.h"
#include "ops/linear/linear_cuda.h"
#include "ops/quant/quant_cuda.h"
#include "opforge/registry.h"
#include "opforge/tensor.h"

namespace {

using namespace opforge;

const Device kGpu = Device::cuda(0);
const Context kGpuCtx{Device::cuda(0), Stream{}};

#define REQUIRE_CUDA()                                                     \
  do {                                                                     \
    Availability a = cuda_availability();                                  \
    if (!a.ok) GTEST_SKIP() << "CUDA unavailable: " << a.reason;           \
    static Registry backend_only;                                          \
    static bool installed = (register_cuda_backend(backend_only), true);   \
    (void)installed;                                                       \
  } while (0)

// A device tensor of `shape` filled on the host: N(0, 1) with rare x16 outliers, or U(0.5, 1.5).
Tensor device_random(const Shape& shape, DType dtype, uint32_t seed, bool positive = false) {
  Tensor host = Tensor::empty(shape, dtype);
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.5, 1.5);
  for (int64_t i = 0; i < host.numel(); ++i)
    store_from_double(host.data(), dtype, i,
                      positive ? uniform(rng) : normal(rng) * (rng() % 97 == 0 ? 16.0 : 1.0));
  return Tensor::copy_of(host.view(), kGpu, dtype);
}
Tensor host_copy(const Tensor& dev) { return Tensor::copy_of(dev.view(), Device::cpu(), dev.dtype()); }

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = host_copy(a), hb = host_copy(b);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.data(), hb.data(), size_t(ha.nbytes())) == 0;
}

// Every element of `got` within the dtype's tolerance (atol at least `atol_floor`) of `want`.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what, double atol_floor) {
  const Tensor g = host_copy(got), w = host_copy(want);
  ASSERT_EQ(g.numel(), w.numel()) << what;
  Tolerance tol = default_tolerance(g.dtype());
  tol.atol = std::max(tol.atol, atol_floor);
  int failures = 0;
  for (int64_t i = 0; i < g.numel() && failures < 5; ++i) {
    const double a = load_as_double(g.data(), g.dtype(), i), b = load_as_double(w.data(), w.dtype(), i);
    if (std::isnan(a) || !(std::fabs(a - b) <= tol.atol + tol.rtol * std::fabs(b)))
      ++failures, ADD_FAILURE() << what << ": [" << i << "] got " << a << " want " << b;
  }
}

std::string name_of(const char* op, DType t, int64_t rows, int64_t cols) {
  return std::string(op) + " " + dtype_name(t) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

TEST(CudaMembw, QuantFp8CoopIsBitExactWithVec16) {
  REQUIRE_CUDA();
  struct Case {
    DType dtype;
    int64_t rows, cols;
  };
  // 16384 x 4096 bf16: several steps per block; odd sizes: the scalar tail; 1 x 1: tail only.
  for (const Case& c : {Case{DType::bf16, 16384, 4096}, Case{DType::f32, 3000, 4096}, Case{DType::f16, 7, 33},
                        Case{DType::f32, 5, 4097}, Case{DType::bf16, 1, 1}, Case{DType::bf16, 0, 64}}) {
    const Shape shape{c.rows, c.cols};
    const Tensor x = device_random(shape, c.dtype, 7);
    Tensor q_coop = Tensor::zeros(shape, DType::f8e4m3, kGpu), q_ref = Tensor::zeros(shape, DType::f8e4m3, kGpu);
    Tensor s_coop = Tensor::zeros(Shape{1}, DType::f32, kGpu), s_ref = Tensor::zeros(Shape{1}, DType::f32, kGpu);
    if (const char* why = quant_fp8_cuda_vec16_coop_applicable(q_coop, s_coop, x, TensorView{}, "per_tensor", 0.0)) {
      ADD_FAILURE() << name_of("quant_fp8 coop", c.dtype, c.rows, c.cols) << " rejected: " << why;
      continue;
    }
    quant_fp8_cuda_vec16_coop(kGpuCtx, q_coop, s_coop, x, TensorView{}, "per_tensor", 0.0);
    const bool vec = quant_fp8_cuda_vec16_applicable(q_ref, s_ref, x, TensorView{}, "per_tensor", 0.0) == nullptr;
    (vec ? quant_fp8_cuda_vec16 : quant_fp8_cuda)(kGpuCtx, q_ref, s_ref, x, TensorView{}, "per_tensor", 0.0);
    EXPECT_TRUE(same_bits(s_coop, s_ref)) << name_of("quant_fp8 scale", c.dtype, c.rows, c.cols);
    EXPECT_TRUE(same_bits(q_coop, q_ref)) << name_of("quant_fp8 q", c.dtype, c.rows, c.cols);
  }
}

TEST(CudaMembw, LayerNormRowblockMatchesVec16) {
  REQUIRE_CUDA();
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (int64_t rows : {int64_t(4096), int64_t(130), int64_t(5)})
      for (int64_t cols : {int64_t(4096), int64_t(2048), int64_t(8192)}) {
        const Shape shape{rows, cols};
        const Tensor x = device_random(shape, t, 1);
        const Tensor w = device_random(Shape{cols}, t, 2, true), b = device_random(Shape{cols}, t, 3);
        Tensor y_new = Tensor::zeros(shape, t, kGpu), y_old = Tensor::zeros(shape, t, kGpu);
        if (rows < 128) {  // few rows go to cuda_vec16 (the predicate's kMinRows)
          EXPECT_STREQ(layer_norm_cuda_vec16_rowblock_applicable(y_new, x, w, b, 1e-5),
                       "fewer than 128 rows (cuda_vec16 is faster at few rows)");
          continue;
        }
        ASSERT_EQ(layer_norm_cuda_vec16_rowblock_applicable(y_new, x, w, b, 1e-5), nullptr);
        layer_norm_cuda_vec16_rowblock(kGpuCtx, y_new, x, w, b, 1e-5);
        layer_norm_cuda_vec16(kGpuCtx, y_old, x, w, b, 1e-5);
        expect_close(y_new, y_old, name_of("layer_norm rowblock vs vec16", t, rows, cols), 0.0);
      }
}

// From 4 rows an SM on (f32: 4 to 16) the bulk-copy pipeline of ops/layernorm/cuda_backward_bulk.cu
// runs (on an H100 / H200: 3,000 rows, and 16,384 in 16-bit types), one and two packs a thread
// (hidden 1,024 / 4,096 in 16-bit types, 4,096 in f32; 8,192 bf16); fewer rows, and f32 at 16,384,
// take the ring (cp.async or bulk-filled), in rows just past one and two a resident block too.
TEST(CudaMembw, LayerNormBackwardAsyncMatchesVec16AndRepeats) {
  REQUIRE_CUDA();
  struct Shape2 {
    DType t;
    int64_t rows, cols;
  };
  std::vector<Shape2> shapes;
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (int64_t rows : {int64_t(16384), int64_t(3000), int64_t(16), int64_t(0)}) shapes.push_back({t, rows, 4096});
  for (DType t : {DType::bf16, DType::f16, DType::f32}) shapes.push_back({t, 3000, 1024});
  shapes.push_back({DType::bf16, 2500, 8192});
  // Just past one and two rows a resident block (the ring's strided rows with `parts` below the grid).
  for (DType t : {DType::bf16, DType::f32})
    for (int64_t rows : {int64_t(133), int64_t(265), int64_t(529)}) shapes.push_back({t, rows, 4096});
  for (const auto& [t, rows, cols] : shapes) {
    const Shape shape{rows, cols};
    const Tensor x = device_random(shape, t, 4), dy = device_random(shape, t, 5);
    const Tensor w = device_random(Shape{cols}, t, 6, true);
    Tensor dx[3], dw[3], db[3];
    for (int k = 0; k < 3; ++k) {
      dx[k] = Tensor::zeros(shape, t, kGpu);
      dw[k] = Tensor::zeros(Shape{cols}, t, kGpu);
      db[k] = Tensor::zeros(Shape{cols}, t, kGpu);
    }
    ASSERT_EQ(layer_norm_backward_cuda_vec16_async_applicable(dx[0], dw[0], db[0], dy, x, w, 1e-5), nullptr);
    layer_norm_backward_cuda_vec16_async(kGpuCtx, dx[0], dw[0], db[0], dy, x, w, 1e-5);
    layer_norm_backward_cuda_vec16_async(kGpuCtx, dx[1], dw[1], db[1], dy, x, w, 1e-5);
    layer_norm_backward_cuda_vec16(kGpuCtx, dx[2], dw[2], db[2], dy, x, w, 1e-5);
    const std::string what = name_of("layer_norm_backward async", t, rows, cols);
    EXPECT_TRUE(same_bits(dx[0], dx[1])) << what << " dx repeat";
    EXPECT_TRUE(same_bits(dw[0], dw[1])) << what << " dw repeat";
    EXPECT_TRUE(same_bits(db[0], db[1])) << what << " db repeat";
    // dw and db sum up to 16384 rows in f32 in a different order than cuda_vec16.
    const double sum_floor = t == DType::f32 ? 1e-3 : 0.0;
    expect_close(dx[0], dx[2], what + " dx vs vec16", 0.0);
    expect_close(dw[0], dw[2], what + " dw vs vec16", sum_floor);
    expect_close(db[0], db[2], what + " db vs vec16", sum_floor);
  }
}

// fused_linear_cross_entropy forward and backward at 8,192 tokens x 4,096 -> 128,256 in bf16: the
// device memory the backend holds after each call, measured with cudaMemGetInfo on a new stream
// (so the workspace starts empty), stays below 1/8 of the logits in bf16 (2.1 GB) and agrees with
// the call's own figure (flce_cuda_last_workspace_bytes, Note [flce cuda blocks]).
TEST(CudaMembw, FlceExtraMemoryIsMeasuredBelowAnEighthOfTheLogits) {
  REQUIRE_CUDA();
  const int64_t tokens = 8192, h = 4096, vocab = 128256;
  const double logits_bytes = double(tokens) * double(vocab) * 2.0;
  if (double(cuda_free_memory_bytes(0)) < 4.0 * double(vocab) * double(h) * 2.0)
    GTEST_SKIP() << "not enough free device memory for the 128256 x 4096 weight and its gradient";
  const Tensor hidden = device_random(Shape{tokens, h}, DType::bf16, 11);
  const Tensor w = Tensor::zeros(Shape{vocab, h}, DType::bf16, kGpu);  // every logit 0: the bytes are what count
  Tensor target_host = Tensor::empty(Shape{tokens}, DType::i64);
  for (int64_t i = 0; i < tokens; ++i) static_cast<int64_t*>(target_host.data())[i] = (i * 7919) % vocab;
  const Tensor target = Tensor::copy_of(target_host.view(), kGpu, DType::i64);
  Tensor loss = Tensor::zeros(Shape{}, DType::f32, kGpu), dloss = Tensor::zeros(Shape{}, DType::f32, kGpu);
  Tensor dhidden = Tensor::zeros(Shape{tokens, h}, DType::bf16, kGpu), dw = Tensor::zeros(Shape{vocab, h}, DType::bf16, kGpu);
  Tensor db = Tensor::zeros(Shape{vocab}, DType::bf16, kGpu);  // the backward always writes db (the op's check)
  Tensor lse = Tensor::zeros(Shape{tokens}, DType::f32, kGpu);  // an output of the forward, read by the backward
  void* stream = cuda_create_stream(0);
  const Context ctx{Device::cuda(0), Stream{stream}};
  const int64_t free0 = cuda_free_memory_bytes(0);
  ASSERT_EQ(fused_linear_cross_entropy_cuda_applicable(loss, lse, hidden, w, target, TensorView{}, -100, 0.0, "mean"),
            nullptr);
  fused_linear_cross_entropy_cuda(ctx, loss, lse, hidden, w, target, TensorView{}, -100, 0.0, "mean");
  const int64_t planned_fwd = flce_cuda_last_workspace_bytes();
  const int64_t after_fwd = free0 - cuda_free_memory_bytes(0);
  ASSERT_EQ(fused_linear_cross_entropy_backward_cuda_applicable(dhidden, dw, db, dloss, hidden, w, target, lse,
                                                                TensorView{}, -100, 0.0, "mean"),
            nullptr);
  fused_linear_cross_entropy_backward_cuda(ctx, dhidden, dw, db, dloss, hidden, w, target, lse, TensorView{}, -100,
                                           0.0, "mean");
  const int64_t planned_bwd = flce_cuda_last_workspace_bytes();
  const int64_t after_bwd = free0 - cuda_free_memory_bytes(0);
  cuda_destroy_stream(0, stream);
  std::printf("flce %lld x %lld -> %lld bf16: extra device memory held after forward %.1f MiB (planned %.1f), after "
              "backward %.1f MiB (planned %.1f); 1/8 of the logits %.1f MiB\n",
              static_cast<long long>(tokens), static_cast<long long>(h), static_cast<long long>(vocab),
              double(after_fwd) / 1048576.0, double(planned_fwd) / 1048576.0, double(after_bwd) / 1048576.0,
              double(planned_bwd) / 1048576.0, logits_bytes / 8.0 / 1048576.0);
  EXPECT_GE(after_fwd, planned_fwd);  // the workspace was allocated on this stream (Note [cuda workspace])
  EXPECT_LT(double(after_fwd), logits_bytes / 8.0);
  EXPECT_LT(double(after_bwd), logits_bytes / 8.0);

  // fused_linear_cross_entropy_with_grad (Note [flce with grad]) on another new stream.
  void* stream2 = cuda_create_stream(0);
  const Context ctx2{Device::cuda(0), Stream{stream2}};
  const int64_t free1 = cuda_free_memory_bytes(0);
  ASSERT_EQ(fused_linear_cross_entropy_with_grad_cuda_applicable(loss, lse, dhidden, dw, db, hidden, w, target, dloss,
                                                                 TensorView{}, -100, 0.0, "mean"),
            nullptr);
  fused_linear_cross_entropy_with_grad_cuda(ctx2, loss, lse, dhidden, dw, db, hidden, w, target, dloss, TensorView{},
                                            -100, 0.0, "mean");
  const int64_t planned_both = flce_cuda_last_workspace_bytes();
  const int64_t after_both = free1 - cuda_free_memory_bytes(0);
  cuda_destroy_stream(0, stream2);
  std::printf("flce with grad: extra device memory held after the call %.1f MiB (planned %.1f)\n",
              double(after_both) / 1048576.0, double(planned_both) / 1048576.0);
  EXPECT_GE(after_both, planned_both);
  EXPECT_LT(double(after_both), logits_bytes / 8.0);
}

}  // namespace

#endif  // OPFORGE_WITH_CUDA
