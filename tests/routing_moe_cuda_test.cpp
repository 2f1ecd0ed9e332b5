// The CUDA kernels of moe_permute and moe_unpermute (ops/routing/cuda_moe.cu) on what the harness
// cannot produce: ids and inv_perm entries out of range on the device (the checks do not read
// device memory), over many chunks of the counting sort, compared with the documented result.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "opforge/registry.h"
#include "opforge/tensor.h"

#ifndef OPFORGE_WITH_CUDA

TEST(CudaMoe, NeedsCuda) { GTEST_SKIP() << "opforge was built without CUDA"; }

#else

#include "backends/cuda/cuda_backend.h"
#include "ops/routing/routing_cuda.h"

namespace {

using namespace opforge;

const Device kGpu = Device::cuda(0);
const Context kGpuCtx{Device::cuda(0), Stream{}};

#define REQUIRE_CUDA()                                                   \
  do {                                                                   \
    Availability a = cuda_availability();                                \
    if (!a.ok) GTEST_SKIP() << "CUDA unavailable: " << a.reason;         \
    static Registry backend_only;                                        \
    static bool installed = (register_cuda_backend(backend_only), true); \
    (void)installed;                                                     \
  } while (0)

Tensor host(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t = Tensor::zeros(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) store_from_double(t.data(), dtype, int64_t(i), values[i]);
  return t;
}
std::vector<double> values_of(const Tensor& device_tensor) {
  Tensor t = Tensor::copy_of(device_tensor.view(), Device::cpu(), device_tensor.dtype());
  std::vector<double> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_double(t.data(), t.dtype(), int64_t(i));
  return v;
}

// 3000 tokens, k = 8, 128 experts: 24000 pairs, 24 chunks of the sort; every 97th id out of range.
TEST(CudaMoe, PermuteOutOfRangeIdsGoLastInPairOrder) {
  REQUIRE_CUDA();
  const int64_t T = 3000, k = 8, E = 128, H = 64, pairs = T * k;
  std::mt19937 gen(7);
  std::vector<double> ids(static_cast<size_t>(pairs)), xs(static_cast<size_t>(T * H));
  for (int64_t p = 0; p < pairs; ++p) ids[size_t(p)] = p % 97 == 5 ? (p % 2 ? -1.0 : double(E + p % 3)) : double(gen() % E);
  for (int64_t i = 0; i < T * H; ++i) xs[size_t(i)] = double(i % 1001) - 500.0;
  // Expected: buckets 0..E (E = out of range), stable in p.
  std::vector<int64_t> count(size_t(E + 1), 0), start(size_t(E + 2), 0), inv(static_cast<size_t>(pairs));
  auto bucket = [&](double id) { return id >= 0 && id < double(E) ? int64_t(id) : E; };
  for (double id : ids) ++count[size_t(bucket(id))];
  for (int64_t b = 0; b <= E; ++b) start[size_t(b + 1)] = start[size_t(b)] + count[size_t(b)];
  std::vector<int64_t> cursor(start.begin(), start.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) inv[size_t(p)] = cursor[size_t(bucket(ids[size_t(p)]))]++;
  for (DType t : {DType::f32, DType::bf16})
    for (bool vec : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (vec ? " vec16" : " scalar"));
      Tensor x = Tensor::copy_of(host({T, H}, t, xs).view(), kGpu, t);
      Tensor id = Tensor::copy_of(host({T, k}, DType::i32, ids).view(), kGpu, DType::i32);
      Tensor out = Tensor::zeros({pairs, H}, t, kGpu), off = Tensor::zeros({E + 1}, DType::i64, kGpu),
             iv = Tensor::zeros({pairs}, DType::i64, kGpu);
      (vec ? moe_permute_cuda_vec16 : moe_permute_cuda)(kGpuCtx, out.view(), off.view(), iv.view(), x.view(),
                                                        id.view(), E);
      const std::vector<double> o = values_of(off), v = values_of(iv), rows = values_of(out);
      for (int64_t b = 0; b <= E; ++b) ASSERT_EQ(o[size_t(b)], double(start[size_t(b)])) << "offset " << b;
      for (int64_t p = 0; p < pairs; ++p) ASSERT_EQ(v[size_t(p)], double(inv[size_t(p)])) << "pair " << p;
      for (int64_t p = 0; p < pairs; p += 13)
        for (int64_t h = 0; h < H; ++h)
          ASSERT_EQ(rows[size_t(inv[size_t(p)] * H + h)], load_as_double(host({1}, t, {xs[size_t((p / k) * H + h)]}).data(), t, 0));
    }
}

// inv_perm entries outside [0, T * k) contribute nothing.
TEST(CudaMoe, UnpermuteSkipsOutOfRangeRows) {
  REQUIRE_CUDA();
  const int64_t T = 2, k = 3, H = 16, pairs = T * k;
  std::vector<double> in(size_t(pairs * H));
  for (int64_t i = 0; i < pairs * H; ++i) in[size_t(i)] = double(i / H + 1);  // row r holds r + 1
  const std::vector<double> invs = {5, -1, 0, 6, 2, 2}, w = {1, 100, 0.5, 1, 0.25, 0.25};
  const std::vector<double> want = {1 * 6 + 0.5 * 1, 0.25 * 3 + 0.25 * 3};
  for (bool vec : {true, false}) {
    Tensor e = Tensor::copy_of(host({pairs, H}, DType::f32, in).view(), kGpu, DType::f32);
    Tensor iv = Tensor::copy_of(host({pairs}, DType::i32, invs).view(), kGpu, DType::i32);
    Tensor ww = Tensor::copy_of(host({T, k}, DType::f32, w).view(), kGpu, DType::f32);
    Tensor y = Tensor::zeros({T, H}, DType::f32, kGpu);
    (vec ? moe_unpermute_cuda_vec16 : moe_unpermute_cuda)(kGpuCtx, y.view(), e.view(), iv.view(), ww.view());
    const std::vector<double> got = values_of(y);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) EXPECT_EQ(got[size_t(t * H + h)], want[size_t(t)]) << vec << " " << t << " " << h;
  }
}

}  // namespace

#endif  // OPFORGE_WITH_CUDA
