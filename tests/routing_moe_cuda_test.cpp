// The CUDA kernels of moe_permute and moe_unpermute (ops/routing/cuda_moe.cu) on what the harness
// cannot produce: ids and inv_perm entries out of range on the device (the checks do not read
// device memory), over many chunks of the counting sort, and both sides of the one-launch path's
// limit, compared with the documented result (and with the reference kernel where it accepts
// the ids).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "opforge/plan.h"
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

// The documented result (Note [moe permutation], out-of-range ids in an extra bucket E after every
// expert, in pair order): start[b] = first row of bucket b for b = 0..E (start[E + 1] = pairs),
// inv[p] = row of pair p.
struct Permutation {
  std::vector<int64_t> start, inv;
  bool in_range = true;  // every id in [0, E): the reference kernel accepts them
};
Permutation expected_permutation(const std::vector<double>& ids, int64_t E) {
  Permutation r;
  std::vector<int64_t> count(size_t(E + 1), 0);
  auto bucket = [&](double id) { return id >= 0 && id < double(E) ? int64_t(id) : E; };
  for (double id : ids) {
    ++count[size_t(bucket(id))];
    r.in_range = r.in_range && bucket(id) < E;
  }
  r.start.assign(size_t(E + 2), 0);
  for (int64_t b = 0; b <= E; ++b) r.start[size_t(b + 1)] = r.start[size_t(b)] + count[size_t(b)];
  std::vector<int64_t> cursor(r.start.begin(), r.start.end() - 1);
  r.inv.resize(ids.size());
  for (size_t p = 0; p < ids.size(); ++p) r.inv[p] = cursor[size_t(bucket(ids[p]))]++;
  return r;
}

// Every 97th id out of range. 3000 tokens, k = 8, 128 experts: 24000 pairs, 94 chunks of the sort
// (the last one partial); 301 tokens, k = 10, 16 experts: two batches of a token's rows in the
// copy kernel, the second partial (kCopyBatch = 8); 700 tokens, k = 6, 1000 experts: chunks as
// long as the bucket count (1,024 pairs), each walked in four batches of rank steps.
void expect_sort_path_permutes(int64_t T, int64_t k, int64_t E) {
  SCOPED_TRACE("T " + std::to_string(T) + " k " + std::to_string(k) + " E " + std::to_string(E));
  const int64_t H = 64, pairs = T * k;
  std::mt19937 gen(7);
  std::vector<double> ids(static_cast<size_t>(pairs)), xs(static_cast<size_t>(T * H));
  for (int64_t p = 0; p < pairs; ++p) ids[size_t(p)] = p % 97 == 5 ? (p % 2 ? -1.0 : double(E + p % 3)) : double(gen() % E);
  for (int64_t i = 0; i < T * H; ++i) xs[size_t(i)] = double(i % 1001) - 500.0;
  // Expected: buckets 0..E (E = out of range), stable in p.
  const Permutation want = expected_permutation(ids, E);
  const std::vector<int64_t>& start = want.start;
  const std::vector<int64_t>& inv = want.inv;
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

TEST(CudaMoe, PermuteOutOfRangeIdsGoLastInPairOrder) {
  REQUIRE_CUDA();
  expect_sort_path_permutes(3000, 8, 128);
  expect_sort_path_permutes(301, 10, 16);
  expect_sort_path_permutes(700, 6, 1000);
}

// Note [plan regimes]: the launch notes which path it took, so that the collector keeps the rows of
// the one-launch path (pairs <= 4096) and of the sort path apart.
TEST(CudaMoe, PermuteNotesItsPath) {
  REQUIRE_CUDA();
  for (int64_t T : {int64_t(512), int64_t(513)}) {
    const int64_t k = 8, E = 128, H = 16, pairs = T * k;
    std::vector<double> ids(static_cast<size_t>(pairs));
    for (int64_t p = 0; p < pairs; ++p) ids[size_t(p)] = double(p % E);
    Tensor x = Tensor::zeros({T, H}, DType::bf16, kGpu);
    Tensor id = Tensor::copy_of(host({T, k}, DType::i32, ids).view(), kGpu, DType::i32);
    Tensor out = Tensor::zeros({pairs, H}, DType::bf16, kGpu), off = Tensor::zeros({E + 1}, DType::i64, kGpu),
           iv = Tensor::zeros({pairs}, DType::i64, kGpu);
    plan::Recording rec;
    moe_permute_cuda_vec16(kGpuCtx, out.view(), off.view(), iv.view(), x.view(), id.view(), E);
    const std::vector<plan::Decision> d = rec.decisions();
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].key, "sort");
    EXPECT_EQ(d[0].on, pairs > 4096) << pairs;
    EXPECT_EQ(d[0].value, double(pairs));
    EXPECT_EQ(d[0].threshold, 4097.0);
  }
}

// The one-launch path (cuda_moe.cu's kSmallPairs = 4096: pairs <= 4096) and the sort path just
// above it must give the same bits: pairs = 1, 128 (16 tokens x 8), 4096 (512 x 8 and 4096 x 1:
// exactly kSmallPairs), 4097 (kSmallPairs + 1) and 4104 (513 x 8). Ids: every pair to one expert
// (the stable order is all that decides the rows), four experts with every 37th id out of range
// (-1, E, E + 5, INT32_MIN, INT32_MAX; pair 0 among them), every id out of range, and 4095 experts
// (the most buckets, 4096) with repeats. Both kernels, f32 and bf16, i32 and i64 inv_perm, hidden
// 16 and 0 (inv_perm and offsets are still written). Every row of x is distinct: x[t, 0] = t %
// 256, x[t, 1] = t / 256, then (t + h) % 256 - 128 (integers, exact in bf16).
TEST(CudaMoe, PermuteSmallPathMatchesReferenceAcrossItsLimit) {
  REQUIRE_CUDA();
  static Registry reference;
  static bool registered = (register_routing(reference), true);
  (void)registered;
  struct Shape2 {
    int64_t T, k;
  };
  // Both sides of Note [small id batches] (768 pairs) and of the one-launch path (4,096 pairs).
  const Shape2 shapes[] = {{1, 1}, {16, 8}, {96, 8}, {97, 8}, {512, 8}, {4096, 1}, {4097, 1}, {513, 8}};
  const double out_of_range[] = {-1.0, 0.0 /* E */, 5.0 /* E + 5 */, -2147483648.0, 2147483647.0};
  for (const Shape2& s : shapes)
    for (int pattern = 0; pattern < 4; ++pattern) {
      const int64_t T = s.T, k = s.k, pairs = T * k, E = pattern == 3 ? 4095 : pattern == 1 ? 4 : 8;
      std::mt19937 gen(unsigned(11 + pattern));
      std::vector<double> ids(static_cast<size_t>(pairs));
      for (int64_t p = 0; p < pairs; ++p) {
        double& id = ids[size_t(p)];
        if (pattern == 0) id = 3;
        else if (pattern == 2) id = p % 2 ? -1.0 : double(E);
        else if (pattern == 1 && p % 37 == 0) {
          const int64_t which = (p / 37) % 5;
          id = which == 1 || which == 2 ? double(E) + out_of_range[which] : out_of_range[which];
        } else if (pattern == 1) id = double(gen() % 4);
        else id = p % 5 == 0 ? double(E - 1) : double(gen() % 4095);
      }
      const Permutation want = expected_permutation(ids, E);
      SCOPED_TRACE("T " + std::to_string(T) + " k " + std::to_string(k) + " pattern " + std::to_string(pattern));
      for (int64_t H : {int64_t(16), int64_t(0)}) {
        std::vector<double> xs(size_t(T * H));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h)
            xs[size_t(t * H + h)] = h == 0 ? double(t % 256) : h == 1 ? double(t / 256) : double((t + h) % 256) - 128.0;
        std::vector<double> want_rows(size_t(pairs * H));
        for (int64_t p = 0; p < pairs; ++p)
          for (int64_t h = 0; h < H; ++h) want_rows[size_t(want.inv[size_t(p)] * H + h)] = xs[size_t((p / k) * H + h)];
        std::vector<double> want_off(want.start.begin(), want.start.end() - 1), want_inv(want.inv.begin(), want.inv.end());
        if (want.in_range && H > 0) {  // the reference kernel (host) gives the documented result
          Tensor x = host({T, H}, DType::f32, xs), id = host({T, k}, DType::i32, ids);
          Tensor out = Tensor::zeros({pairs, H}, DType::f32), off = Tensor::zeros({E + 1}, DType::i64),
                 iv = Tensor::zeros({pairs}, DType::i64);
          reference.call("moe_permute", std::vector<Value>{out.view(), off.view(), iv.view(), x.view(), id.view(), E},
                         Policy::parse("moe_permute=reference"));
          ASSERT_EQ(values_of(off), want_off) << "reference offsets";
          ASSERT_EQ(values_of(iv), want_inv) << "reference inv_perm";
          ASSERT_EQ(values_of(out), want_rows) << "reference rows";
        }
        for (DType t : {DType::f32, DType::bf16})
          for (bool vec : {true, false})
            for (DType inv_dtype : {DType::i32, DType::i64}) {
              SCOPED_TRACE(std::string(dtype_name(t)) + (vec ? " vec16" : " scalar") + " inv " +
                           dtype_name(inv_dtype) + " H " + std::to_string(H));
              Tensor x = Tensor::copy_of(host({T, H}, t, xs).view(), kGpu, t);
              Tensor id = Tensor::copy_of(host({T, k}, DType::i32, ids).view(), kGpu, DType::i32);
              Tensor out = Tensor::zeros({pairs, H}, t, kGpu), off = Tensor::zeros({E + 1}, DType::i64, kGpu),
                     iv = Tensor::zeros({pairs}, inv_dtype, kGpu);
              (vec ? moe_permute_cuda_vec16 : moe_permute_cuda)(kGpuCtx, out.view(), off.view(), iv.view(), x.view(),
                                                                id.view(), E);
              ASSERT_EQ(values_of(off), want_off) << "expert_offsets";
              ASSERT_EQ(values_of(iv), want_inv) << "inv_perm";
              ASSERT_EQ(values_of(out), want_rows) << "permuted";
            }
      }
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
