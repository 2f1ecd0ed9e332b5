// CUDA kernels of the loss family (kl_div, jsd, tvd: ops/loss/cuda_divergence.cu) and of
// fused_linear_cross_entropy (ops/linear/flce_cuda.cu): what runs without a GPU in a CUDA build.
// The vec16 predicates name what rules a layout out; the fused kernel's chunk plan keeps its
// workspace below 1/8 of the logits (Note [flce cuda blocks]). Correctness on the device is the
// harness's (`opforge check --backend cuda`).
#include <gtest/gtest.h>

#ifndef OPFORGE_WITH_CUDA

TEST(CudaLoss, NeedsCuda) { GTEST_SKIP() << "opforge was built without CUDA"; }

#else

#include <cstdint>
#include <cstdlib>

#include "backends/cuda/cuda_backend.h"
#include "opforge/tensor.h"
#include "ops/linear/linear_cuda.h"
#include "ops/loss/loss_cuda.h"

namespace {

using namespace opforge;

// A view of `rows` x `cols` elements with row stride `stride` starting `offset` elements into
// `t` (host memory: the predicates only look at pointers, dtypes and strides).
TensorView view_of(const Tensor& t, int64_t rows, int64_t cols, int64_t stride, int64_t offset = 0) {
  const int64_t strides[2] = {stride, 1};
  return TensorView(static_cast<char*>(t.data()) + offset * t.view().itemsize(), t.dtype(), Shape{rows, cols},
                    strides, Device::cpu());
}

TEST(CudaLoss, DivergenceVec16PredicatesExplainRejections) {
  const Tensor a = Tensor::zeros({4 * 4104}, DType::bf16), b = Tensor::zeros({4 * 4104}, DType::bf16);
  const Tensor out = Tensor::zeros({4 * 4104}, DType::bf16), loss = Tensor::zeros({1}, DType::f32);
  const TensorView none;
  const TensorView x = view_of(a, 4, 4096, 4096), y = view_of(b, 4, 4096, 4096);
  EXPECT_EQ(kl_div_cuda_vec16_applicable(loss.view(), x, y, false, "batchmean", 1e-10), nullptr);
  EXPECT_EQ(jsd_cuda_vec16_applicable(loss.view(), x, y, none, 0.5, -100), nullptr);
  EXPECT_EQ(tvd_cuda_vec16_applicable(loss.view(), x, y, none, "sum", -100), nullptr);
  // Odd rows, padded rows, a shifted base: the scalar kernel takes them.
  EXPECT_STREQ(tvd_cuda_vec16_applicable(loss.view(), view_of(a, 4, 4097, 4097), view_of(b, 4, 4097, 4097), none,
                                         "sum", -100),
               "row length % 8 != 0");
  EXPECT_STREQ(jsd_cuda_vec16_applicable(loss.view(), view_of(a, 4, 4096, 4100), y, none, 0.5, -100),
               "row stride % 8 != 0");
  EXPECT_STREQ(kl_div_cuda_vec16_applicable(loss.view(), x, view_of(b, 4, 4096, 4096, 1), false, "sum", 1e-10),
               "a data pointer is not 16-byte aligned");
  // reduction none writes [N, V] packs: the output's layout counts too.
  EXPECT_STREQ(kl_div_cuda_vec16_applicable(view_of(out, 4, 4096, 4104 - 4), x, y, false, "none", 1e-10),
               "row stride % 8 != 0");
  EXPECT_EQ(kl_div_cuda_vec16_applicable(view_of(out, 4, 4096, 4096), x, y, false, "none", 1e-10), nullptr);
  const Tensor dloss = Tensor::zeros({4 * 4104}, DType::bf16);
  EXPECT_STREQ(tvd_backward_cuda_vec16_applicable(view_of(out, 4, 4096, 4096), view_of(dloss, 4, 4096, 4096, 3),
                                                  x, y, none, "none", -100),
               "a data pointer is not 16-byte aligned");
  // f64 goes to the reference; a reduced f64 loss is not f32.
  const Tensor d = Tensor::zeros({8}, DType::f64);
  EXPECT_STREQ(tvd_cuda_applicable(loss.view(), view_of(d, 2, 4, 4), view_of(d, 2, 4, 4), none, "sum", -100),
               "dtype is not f32, f16 or bf16");
  const Tensor f = Tensor::zeros({8}, DType::f32), loss64 = Tensor::zeros({1}, DType::f64);
  EXPECT_STREQ(kl_div_cuda_applicable(loss64.view(), view_of(f, 2, 4, 4), view_of(f, 2, 4, 4), false, "sum", 1e-10),
               "the reduced loss is not f32");
  // Backward: a reduced dloss may have any floating dtype.
  EXPECT_EQ(jsd_backward_cuda_applicable(view_of(f, 2, 4, 4), loss64.view(), view_of(f, 2, 4, 4),
                                         view_of(f, 2, 4, 4), none, 0.5, -100),
            nullptr);
}

// Note [flce cuda blocks]: at the shape (8,192 tokens, H 4,096, V 128,256, bf16) the
// workspace of either call stays below 1/8 of the logits in the input dtype, the forward takes
// every token in one block and the backward equal blocks of a multiple of 64 rows; small
// problems take one block; OPFORGE_CUDA_FLCE_BLOCK forces one.
TEST(CudaLoss, FlceBlocksKeepTheWorkspaceBelowAnEighthOfTheLogits) {
  const int64_t tokens = 8192, h = 4096, vocab = 128256;
  const double eighth = double(tokens) * double(vocab) * 2.0 / 8.0;
  for (bool backward : {false, true})
    for (bool reduced : {false, true}) {
      const FlceCudaPlan p = flce_cuda_plan(tokens, h, vocab, DType::bf16, backward, reduced && !backward);
      const int64_t allocated = cuda_workspace_bytes_for(p.workspace_bytes);  // Note [cuda workspace]
      EXPECT_LT(double(allocated), eighth) << backward << reduced;
      EXPECT_GT(double(allocated), 0.75 * eighth) << backward << reduced;  // most of the budget in use
      EXPECT_GE(p.vocab_cols, 2048) << backward << reduced;
      EXPECT_EQ(p.vocab_cols % 128, 0);
      if (backward) {
        EXPECT_EQ(p.token_rows % 64, 0);
        const int64_t blocks = (tokens + p.token_rows - 1) / p.token_rows;
        EXPECT_LE(blocks, 2);  // dw is rounded once per token block
        EXPECT_LT(int64_t(blocks - 1) * p.token_rows, tokens);
      } else {
        EXPECT_EQ(p.token_rows, tokens);
      }
    }
  const FlceCudaPlan f32 = flce_cuda_plan(tokens, h, vocab, DType::f32, true, false);
  EXPECT_LT(double(f32.workspace_bytes), double(tokens) * double(vocab) * 4.0 / 8.0);
  EXPECT_EQ(f32.token_rows, tokens);  // no 16-bit dhidden accumulator: every token in one block
  const FlceCudaPlan small = flce_cuda_plan(64, 4096, 32000, DType::bf16, true, false);
  EXPECT_EQ(small.token_rows, 64);
  EXPECT_EQ(small.vocab_cols, 32000);
  EXPECT_EQ(flce_cuda_plan(8, 24, 11, DType::f16, false, true).token_rows, 8);
  EXPECT_EQ(flce_cuda_plan(200, 64, 1000, DType::bf16, true, false).token_rows, 200);
  EXPECT_EQ(flce_cuda_plan(0, 16, 5, DType::f32, true, false).token_rows, 1);
  setenv("OPFORGE_CUDA_FLCE_BLOCK", "64x256", 1);
  const FlceCudaPlan forced = flce_cuda_plan(200, 64, 1000, DType::bf16, true, false);
  unsetenv("OPFORGE_CUDA_FLCE_BLOCK");
  EXPECT_EQ(forced.token_rows, 64);
  EXPECT_EQ(forced.vocab_cols, 256);
}

// Note [flce with grad]: token blocks of whole rows within the same budget; at the shape
// 22 blocks of 384 tokens; small problems one block; a forced block narrower than V (or a row
// too wide for 64 of them) takes the forward and the backward instead (token_rows 0).
TEST(CudaLoss, FlceWithGradHoldsWholeRowsBelowAnEighthOfTheLogits) {
  const int64_t tokens = 8192, h = 4096, vocab = 128256;
  const double eighth = double(tokens) * double(vocab) * 2.0 / 8.0;
  for (bool reduced : {false, true}) {
    const FlceCudaPlan p = flce_cuda_with_grad_plan(tokens, h, vocab, DType::bf16, reduced);
    EXPECT_LT(double(cuda_workspace_bytes_for(p.workspace_bytes)), eighth) << reduced;
    EXPECT_EQ(p.vocab_cols, vocab);
    EXPECT_EQ(p.token_rows, 384);
    EXPECT_EQ(p.token_rows % 64, 0);
  }
  const FlceCudaPlan f32 = flce_cuda_with_grad_plan(tokens, h, vocab, DType::f32, true);
  EXPECT_LT(double(f32.workspace_bytes), double(tokens) * double(vocab) * 4.0 / 8.0);
  EXPECT_EQ(f32.token_rows % 64, 0);
  EXPECT_GT(f32.token_rows, 384);  // twice the budget for the same rows
  EXPECT_EQ(flce_cuda_with_grad_plan(200, 64, 1000, DType::bf16, true).token_rows, 200);
  EXPECT_EQ(flce_cuda_with_grad_plan(8, 24, 11, DType::f16, false).token_rows, 8);
  EXPECT_EQ(flce_cuda_with_grad_plan(64, 16, int64_t(1) << 20, DType::bf16, true).token_rows, 0);
  setenv("OPFORGE_CUDA_FLCE_BLOCK", "64x256", 1);
  EXPECT_EQ(flce_cuda_with_grad_plan(200, 64, 1000, DType::bf16, true).token_rows, 0);
  setenv("OPFORGE_CUDA_FLCE_BLOCK", "64x1000", 1);
  EXPECT_EQ(flce_cuda_with_grad_plan(200, 64, 1000, DType::bf16, true).token_rows, 64);
  unsetenv("OPFORGE_CUDA_FLCE_BLOCK");
}

}  // namespace

#endif  // OPFORGE_WITH_CUDA
