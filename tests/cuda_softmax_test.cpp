// The softmax family's and cross_entropy's CUDA kernels on rows with -inf entries (attention-style
// masks, banned tokens), against the reference: a masked prefix, a row with one finite entry and a
// row of nothing but -inf, at shapes that take each launch path (the few-row cluster with 4 and 8
// units a thread and 16 CTAs a row, the row kernel, and rows too long for a cluster: the
// cooperative split kernel). The harness's random cases hold no -inf, and
// the cluster kernel's 16-bit softmax scales each thread's exps by exp(thread max - row max)
// (Note [few-row softmax cluster]), where a thread's values may all be -inf. Skips without a device.
#include <gtest/gtest.h>

#ifndef OPFORGE_WITH_CUDA

TEST(CudaSoftmax, NeedsCuda) { GTEST_SKIP() << "opforge was built without CUDA"; }

#else

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "backends/cuda/cuda_backend.h"
#include "opforge/registry.h"
#include "opforge/tensor.h"
#include "ops/loss/loss_cuda.h"
#include "ops/softmax/softmax.h"
#include "ops/softmax/softmax_cuda.h"

namespace {

using namespace opforge;

const Context kGpuCtx{Device::cuda(0), Stream{}};
const Context kCpuCtx{};

// Rows of N(0, 4) values with -inf placed as the header says: row 0 masked over its first 60%,
// row 1 (when there is one) -inf except element 7, the last row (from 3 rows on) all -inf.
Tensor masked_rows(int64_t rows, int64_t n, DType dtype) {
  Tensor t = Tensor::empty(Shape{rows, n}, dtype);
  std::mt19937 rng(uint32_t(rows * 131 + n));
  std::normal_distribution<double> normal(0.0, 4.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double v = normal(rng);
      if (r == 0 && c < n * 3 / 5) v = -INFINITY;
      if (r == 1 && c != 7) v = -INFINITY;
      if (rows >= 3 && r == rows - 1) v = -INFINITY;
      store_from_double(t.data(), dtype, r * n + c, v);
    }
  return t;
}

// got against want element by element: NaN where want is NaN, the same infinity, else within `tol`
// (the default tolerance of the input's dtype).
void expect_matches(const Tensor& got, const Tensor& want, const std::string& what, const Tolerance& tol) {
  int failures = 0;
  for (int64_t i = 0; i < want.numel() && failures < 5; ++i) {
    const double g = load_as_double(got.data(), got.dtype(), i), w = load_as_double(want.data(), want.dtype(), i);
    const bool ok = std::isnan(w)   ? std::isnan(g)
                    : std::isinf(w) ? g == w
                                    : std::fabs(g - w) <= tol.atol + tol.rtol * std::fabs(w);
    if (!ok) {
      ++failures;
      ADD_FAILURE() << what << " element " << i << ": got " << g << ", want " << w;
    }
  }
}

TEST(CudaSoftmax, MaskedRowsMatchTheReference) {
  const Availability a = cuda_availability();
  if (!a.ok) GTEST_SKIP() << "CUDA unavailable: " << a.reason;
  static Registry backend_only;  // installs the device memory functions (Tensor::copy_of to cuda:0)
  static const bool installed = (register_cuda_backend(backend_only), true);
  (void)installed;
  struct Shape2 {
    int64_t rows, n;
  };
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (Shape2 s : {Shape2{16, 32000}, Shape2{16, 128256}, Shape2{1, 128256}, Shape2{3, 4096}, Shape2{300, 1024},
                     Shape2{3, 140000}, Shape2{200, 20000}}) {  // the last: Note [many-row cluster]
      const Tensor x = masked_rows(s.rows, s.n, dtype);
      const Tensor xd = Tensor::copy_of(x.view(), Device::cuda(0), dtype);
      using Kernel = void (*)(const Context&, const TensorView&, const TensorView&);
      const struct {
        const char* name;
        Kernel cuda, reference;
      } ops[] = {{"softmax", &softmax_cuda_vec16, &softmax_reference},
                 {"log_softmax", &log_softmax_cuda_vec16, &log_softmax_reference}};
      for (const auto& op : ops) {
        const std::string what = std::string(op.name) + " " + dtype_name(dtype) + " " + std::to_string(s.rows) +
                                 "x" + std::to_string(s.n);
        ASSERT_EQ(softmax_cuda_vec16_applicable(xd.view(), xd.view()), nullptr) << what;
        Tensor yd = Tensor::zeros(Shape{s.rows, s.n}, dtype, Device::cuda(0));
        op.cuda(kGpuCtx, yd.view(), xd.view());
        Tensor want = Tensor::zeros(Shape{s.rows, s.n}, dtype);
        op.reference(kCpuCtx, want.view(), x.view());
        expect_matches(Tensor::copy_of(yd.view(), Device::cpu(), dtype), want, what, default_tolerance(dtype));
      }
      // cross_entropy's lse and per-row loss (targets on finite entries; the all -inf row's NaN).
      Tensor target = Tensor::empty(Shape{s.rows}, DType::i64);
      for (int64_t r = 0; r < s.rows; ++r)
        store_from_double(target.data(), DType::i64, r, r == 1 ? 7 : double(s.n - 1));
      const Tensor td = Tensor::copy_of(target.view(), Device::cuda(0), DType::i64);
      Tensor loss_d = Tensor::zeros(Shape{s.rows}, DType::f32, Device::cuda(0));
      Tensor lse_d = Tensor::zeros(Shape{s.rows}, DType::f32, Device::cuda(0));
      cross_entropy_cuda_vec16(kGpuCtx, loss_d.view(), lse_d.view(), xd.view(), td.view(), -100, 0, 0, 0, "none");
      Tensor loss = Tensor::zeros(Shape{s.rows}, DType::f32), lse = Tensor::zeros(Shape{s.rows}, DType::f32);
      cross_entropy_reference(kCpuCtx, loss.view(), lse.view(), x.view(), target.view(), -100, 0, 0, 0, "none");
      const std::string what = std::string("cross_entropy ") + dtype_name(dtype) + " " + std::to_string(s.rows);
      expect_matches(Tensor::copy_of(lse_d.view(), Device::cpu(), DType::f32), lse, what + " lse",
                     default_tolerance(dtype));
      expect_matches(Tensor::copy_of(loss_d.view(), Device::cpu(), DType::f32), loss, what + " loss",
                     default_tolerance(dtype));
    }
}

}  // namespace

#endif
