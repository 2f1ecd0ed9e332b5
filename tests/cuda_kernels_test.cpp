// CUDA kernels of the norm and activation families against the reference kernels, called directly
// (no registry, no policy): odd sizes, padded rows, misaligned row strides, in-place aliasing,
// determinism of the dw reduction, and tensors of more than 2^31 elements. Every device output is
// poisoned with NaN first; padding must stay NaN (no out-of-bounds write inside the row padding) and
// every real element must be written. Skips with the probe's reason when no usable CUDA device is
// present. CudaKernelsTiming.DISABLED_* print a timing table (scripts/gpu-check.sh runs them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "opforge/registry.h"
#include "opforge/tensor.h"

#ifndef OPFORGE_WITH_CUDA

TEST(CudaKernels, NeedsCuda) { GTEST_SKIP() << "opforge was built without CUDA"; }

#else

#include "backends/cuda/cuda_backend.h"

// Note [cuda availability]: without a usable device the probe answers with a reason (no driver,
// no device, driver older than the runtime, compute capability below 9.0) instead of failing;
// with one it answers ok and the device qualifies. Runs on machines without a GPU too.
// scripts/gpu-check.sh also runs `opforge list` with CUDA_VISIBLE_DEVICES= to see the no-device
// reason on a GPU machine.
TEST(CudaProbe, AnswersWithAReasonOrADevice) {
  const opforge::Availability a = opforge::cuda_availability();
  const opforge::Availability again = opforge::cuda_availability();  // cached, same answer
  EXPECT_EQ(a.ok, again.ok);
  EXPECT_EQ(a.reason, again.reason);
  if (!a.ok) {
    EXPECT_FALSE(a.reason.empty());
    std::printf("CUDA unavailable: %s\n", a.reason.c_str());
    return;
  }
  EXPECT_TRUE(a.reason.empty());
  const opforge::CudaDeviceProps& p = opforge::cuda_device_props(0);
  EXPECT_GE(p.cc_major, 9);
  EXPECT_GT(p.sm_count, 0);
}

#include "ops/activation/activation_cuda.h"
#include "ops/embedding/embedding_cuda.h"
#include "ops/linear/linear_cuda.h"
#include "ops/norm/norm_cuda.h"

namespace {

using namespace opforge;

const Device kGpu = Device::cuda(0);
const Context kGpuCtx{Device::cuda(0), Stream{}};
const Context kCpuCtx{};
constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};

#define REQUIRE_CUDA()                                          \
  do {                                                          \
    Availability a = cuda_availability();                       \
    if (!a.ok) GTEST_SKIP() << "CUDA unavailable: " << a.reason; \
    static Registry backend_only;                               \
    static bool installed = (register_cuda_backend(backend_only), true); \
    (void)installed;                                            \
  } while (0)

enum class Fill { normal_outliers, positive, nan };

// A [rows, cols] matrix (or a [cols] vector when rows < 0) whose rows are `cols + pad` elements
// apart, kept on the host and mirrored on the device. `offset` elements are skipped at the start of
// both copies (to misalign the base).
struct Buf {
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0, pad = 0, offset = 0;
  Tensor host, dev;

  int64_t stride() const { return cols + pad; }
  int64_t rows_or_one() const { return rows < 0 ? 1 : rows; }
  TensorView view_at(void* base, Device d) const {
    char* p = static_cast<char*>(base) + offset * dtype_size(dtype);
    if (rows < 0) return TensorView(p, dtype, Shape{cols}, d);
    const int64_t strides[] = {stride(), 1};
    return TensorView(p, dtype, Shape{rows, cols}, strides, d);
  }
  TensorView host_view() const { return view_at(host.data(), Device::cpu()); }
  TensorView dev_view() const { return view_at(dev.data(), kGpu); }
  int64_t index(int64_t r, int64_t c) const { return offset + r * stride() + c; }
  double at(int64_t r, int64_t c) const { return load_as_double(host.data(), dtype, index(r, c)); }
  void upload() { dev = Tensor::copy_of(host.view(), kGpu, dtype); }
  void download() { host = Tensor::copy_of(dev.view(), Device::cpu(), dtype); }
};

Buf make_buf(int64_t rows, int64_t cols, DType dtype, Fill fill, uint32_t seed, int64_t pad = 0,
             int64_t offset = 0, bool upload = true) {
  Buf b;
  b.dtype = dtype, b.rows = rows, b.cols = cols, b.pad = pad, b.offset = offset;
  const int64_t n = offset + b.rows_or_one() * b.stride();
  b.host = Tensor::empty(Shape{n}, dtype);
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.5, 1.5);
  for (int64_t i = 0; i < n; ++i) {
    double v = std::numeric_limits<double>::quiet_NaN();
    if (fill == Fill::positive) v = uniform(rng);
    if (fill == Fill::normal_outliers) v = normal(rng) * (rng() % 97 == 0 ? 16.0 : 1.0);
    store_from_double(b.host.data(), dtype, i, v);
  }
  if (upload) b.upload();
  return b;
}

Buf poisoned_like(const Buf& like, uint32_t seed = 0) {
  return make_buf(like.rows, like.cols, like.dtype, Fill::nan, seed, like.pad, like.offset);
}

// got: downloaded device output; want: host reference output (same layout). The row padding of
// `got` must hold what it held before the kernel: NaN poison, or for an output written in place
// over an input, that input's padding (`padding_before`).
void expect_close(const Buf& got, const Buf& want, const std::string& what, double atol_floor = 0,
                  const Buf* padding_before = nullptr) {
  Tolerance tol = default_tolerance(got.dtype);
  tol.atol = std::max(tol.atol, atol_floor);
  const size_t item = size_t(dtype_size(got.dtype));
  auto bytes_at = [item](const Buf& b, int64_t r, int64_t c) {
    return static_cast<const char*>(b.host.data()) + size_t(b.index(r, c)) * item;
  };
  int failures = 0;
  for (int64_t r = 0; r < got.rows_or_one() && failures < 5; ++r) {
    for (int64_t c = 0; c < got.stride() && failures < 5; ++c) {
      const double g = got.at(r, c);
      if (c >= got.cols) {  // row padding: never written
        const bool kept = padding_before ? std::memcmp(bytes_at(got, r, c), bytes_at(*padding_before, r, c), item) == 0
                                         : std::isnan(g);
        if (!kept) ++failures, ADD_FAILURE() << what << ": padding written at " << r << "," << c;
        continue;
      }
      const double w = want.at(r, c);
      if (std::isnan(g) || !(std::fabs(g - w) <= tol.atol + tol.rtol * std::fabs(w)))
        ++failures, ADD_FAILURE() << what << ": [" << r << "," << c << "] got " << g << " want " << w;
    }
  }
}

std::string label(const char* op, DType t, int64_t rows, int64_t cols, int64_t pad, bool vec) {
  return std::string(op) + (vec ? "_cuda_vec16 " : "_cuda ") + dtype_name(t) + " [" +
         std::to_string(rows) + ", " + std::to_string(cols) + "] pad " + std::to_string(pad);
}

struct Shape2 {
  int64_t rows, cols, pad;
};
// Odd sizes, one-token rows, rows too long for vec16, padded and misaligned row strides.
const Shape2 kNormShapes[] = {{1, 4096, 0},  {16, 4096, 0}, {7, 1000, 0}, {5, 4095, 0}, {3, 8, 0},
                              {33, 128, 8},  {9, 768, 3},   {2, 1, 0},    {4, 20000, 0}, {130, 64, 0},
                              {1, 16384, 0}, {6, 512, 16}};

// ---- rms_norm / fused_add_rms_norm -------------------------------------------------------------
void check_rms_norm(DType t, Shape2 s, bool vec, bool in_place, double offset) {
  Buf x = make_buf(s.rows, s.cols, t, Fill::normal_outliers, 1, s.pad);
  Buf w = make_buf(-1, s.cols, t, Fill::positive, 2);
  Buf want = poisoned_like(x);
  rms_norm_reference(kCpuCtx, want.host_view(), x.host_view(), w.host_view(), 1e-6, offset);
  Buf y = in_place ? x : poisoned_like(x);
  if (vec && rms_norm_cuda_vec16_applicable(y.dev_view(), x.dev_view(), w.dev_view(), 1e-6, offset))
    return;  // the scalar kernel's case
  (vec ? rms_norm_cuda_vec16 : rms_norm_cuda)(kGpuCtx, y.dev_view(), x.dev_view(), w.dev_view(), 1e-6,
                                              offset);
  y.download();
  expect_close(y, want, label("rms_norm", t, s.rows, s.cols, s.pad, vec) + (in_place ? " in place" : ""),
               0, in_place ? &x : nullptr);
}

TEST(CudaKernels, RmsNormMatchesReference) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const Shape2& s : kNormShapes)
      for (bool vec : {false, true}) check_rms_norm(t, s, vec, false, s.rows % 2 ? 1.0 : 0.0);
}

TEST(CudaKernels, RmsNormInPlace) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const Shape2& s : {Shape2{16, 4096, 0}, Shape2{33, 128, 8}, Shape2{5, 4095, 3}})
      for (bool vec : {false, true}) check_rms_norm(t, s, vec, true, 0.0);
}

void check_fused(DType t, Shape2 s, bool vec, bool in_place) {
  Buf x = make_buf(s.rows, s.cols, t, Fill::normal_outliers, 3, s.pad);
  Buf r = make_buf(s.rows, s.cols, t, Fill::normal_outliers, 4, s.pad);
  Buf w = make_buf(-1, s.cols, t, Fill::positive, 5);
  Buf want_y = poisoned_like(x), want_s = poisoned_like(x);
  fused_add_rms_norm_reference(kCpuCtx, want_y.host_view(), want_s.host_view(), x.host_view(),
                               r.host_view(), w.host_view(), 1e-5, 0.0);
  Buf y = in_place ? x : poisoned_like(x);  // vLLM's form: y over x, s over residual
  Buf sum = in_place ? r : poisoned_like(r);
  if (vec && fused_add_rms_norm_cuda_vec16_applicable(y.dev_view(), sum.dev_view(), x.dev_view(),
                                                      r.dev_view(), w.dev_view(), 1e-5, 0.0))
    return;
  (vec ? fused_add_rms_norm_cuda_vec16 : fused_add_rms_norm_cuda)(
      kGpuCtx, y.dev_view(), sum.dev_view(), x.dev_view(), r.dev_view(), w.dev_view(), 1e-5, 0.0);
  y.download();
  sum.download();
  const std::string what = label("fused_add_rms_norm", t, s.rows, s.cols, s.pad, vec);
  expect_close(y, want_y, what + " y" + (in_place ? " in place" : ""), 0, in_place ? &x : nullptr);
  expect_close(sum, want_s, what + " s" + (in_place ? " in place" : ""), 0, in_place ? &r : nullptr);
}

TEST(CudaKernels, FusedAddRmsNormMatchesReference) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const Shape2& s : kNormShapes)
      for (bool vec : {false, true}) check_fused(t, s, vec, false);
}

TEST(CudaKernels, FusedAddRmsNormInPlace) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const Shape2& s : {Shape2{16, 4096, 0}, Shape2{5, 4095, 0}, Shape2{33, 128, 8}})
      for (bool vec : {false, true}) check_fused(t, s, vec, true);
}

// ---- backward ------------------------------------------------------------------------------------
void check_rms_norm_backward(DType t, Shape2 s, bool vec, bool fused) {
  Buf dy = make_buf(s.rows, s.cols, t, Fill::normal_outliers, 6, s.pad);
  Buf x = make_buf(s.rows, s.cols, t, Fill::normal_outliers, 7, s.pad);
  Buf r = make_buf(s.rows, s.cols, t, Fill::normal_outliers, 8, s.pad);
  Buf ds = make_buf(s.rows, s.cols, t, Fill::normal_outliers, 9, s.pad);
  Buf w = make_buf(-1, s.cols, t, Fill::positive, 10);
  Buf want_dx = poisoned_like(x), want_dr = poisoned_like(x), want_dw = poisoned_like(w);
  Buf dx = poisoned_like(x), dr = poisoned_like(x), dw = poisoned_like(w), dw2 = poisoned_like(w);
  const double eps = 1e-6, offset = fused ? 0.0 : 1.0;
  auto run = [&](const Buf& dw_out) {
    if (!fused) {
      if (vec && rms_norm_backward_cuda_vec16_applicable(dx.dev_view(), dw_out.dev_view(), dy.dev_view(),
                                                         x.dev_view(), w.dev_view(), eps, offset))
        return false;
      (vec ? rms_norm_backward_cuda_vec16 : rms_norm_backward_cuda)(
          kGpuCtx, dx.dev_view(), dw_out.dev_view(), dy.dev_view(), x.dev_view(), w.dev_view(), eps,
          offset);
      return true;
    }
    auto args = std::make_tuple(dx.dev_view(), dr.dev_view(), dw_out.dev_view(), dy.dev_view(),
                                ds.dev_view(), x.dev_view(), r.dev_view(), w.dev_view(), eps, offset);
    if (vec && std::apply(fused_add_rms_norm_backward_cuda_vec16_applicable, args)) return false;
    std::apply([&](auto&&... a) {
      (vec ? fused_add_rms_norm_backward_cuda_vec16 : fused_add_rms_norm_backward_cuda)(kGpuCtx, a...);
    }, args);
    return true;
  };
  if (!run(dw) || !run(dw2)) return;
  if (fused)
    fused_add_rms_norm_backward_reference(kCpuCtx, want_dx.host_view(), want_dr.host_view(),
                                          want_dw.host_view(), dy.host_view(), ds.host_view(),
                                          x.host_view(), r.host_view(), w.host_view(), eps, offset);
  else
    rms_norm_backward_reference(kCpuCtx, want_dx.host_view(), want_dw.host_view(), dy.host_view(),
                                x.host_view(), w.host_view(), eps, offset);
  dx.download(), dw.download(), dw2.download();
  const std::string what = label(fused ? "fused_add_rms_norm_backward" : "rms_norm_backward", t,
                                 s.rows, s.cols, s.pad, vec);
  expect_close(dx, want_dx, what + " dx");
  expect_close(dw, want_dw, what + " dw", 1e-4);  // Note [f32 dw tolerance]
  if (fused) dr.download(), expect_close(dr, want_dr, what + " dresidual");
  EXPECT_EQ(0, std::memcmp(dw.host.data(), dw2.host.data(), size_t(dw.host.nbytes())))
      << what << ": dw differs between two runs (not deterministic)";
}

TEST(CudaKernels, RmsNormBackwardMatchesReference) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const Shape2& s : kNormShapes)
      for (bool vec : {false, true}) check_rms_norm_backward(t, s, vec, false);
  check_rms_norm_backward(DType::bf16, {2048, 4096, 0}, true, false);  // many rows per block
  check_rms_norm_backward(DType::f32, {1000, 256, 4}, false, false);
  // Note [bulk-copy row pipeline] (taken from 16 rows an SM on): at 3,000 x 4,096 a block of an
  // H100/H200 takes 12 or more rows, so its ring of stages wraps (f32: two packs a thread); 1,000
  // elements are not a whole warp of packs; bf16 8192 takes two packs a thread.
  for (DType t : kDTypes)
    for (const Shape2& s : {Shape2{3000, 4096, 0}, Shape2{2500, 1000, 0}})
      for (bool fused : {false, true}) check_rms_norm_backward(t, s, true, fused);
  check_rms_norm_backward(DType::bf16, {2400, 8192, 0}, true, true);
}

TEST(CudaKernels, FusedAddRmsNormBackwardMatchesReference) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const Shape2& s : kNormShapes)
      for (bool vec : {false, true}) check_rms_norm_backward(t, s, vec, true);
}

TEST(CudaKernels, RmsNormBackwardOfNoRowsGivesZeroDw) {
  REQUIRE_CUDA();
  Buf dy = make_buf(0, 64, DType::f32, Fill::normal_outliers, 1);
  Buf w = make_buf(-1, 64, DType::f32, Fill::positive, 2);
  Buf dw = poisoned_like(w);
  for (auto* fn : {&rms_norm_backward_cuda, &rms_norm_backward_cuda_vec16}) {
    fn(kGpuCtx, dy.dev_view(), dw.dev_view(), dy.dev_view(), dy.dev_view(), w.dev_view(), 1e-6, 0.0);
    dw.download();
    for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(dw.at(0, c), 0.0);
  }
}

// ---- silu_and_mul ------------------------------------------------------------------------------
const Shape2 kSiluShapes[] = {{1, 4096, 0}, {16, 14336, 0}, {7, 100, 0}, {5, 333, 0}, {3, 4, 0},
                              {33, 128, 8}, {9, 768, 3},    {2, 1, 0},   {300, 64, 0}};

void check_silu(DType t, Shape2 s, bool vec, bool backward) {
  // x: [rows, 2d] with pad 2*pad; y, dy: [rows, d] with pad.
  Buf x = make_buf(s.rows, 2 * s.cols, t, Fill::normal_outliers, 11, 2 * s.pad);
  Buf dy = make_buf(s.rows, s.cols, t, Fill::normal_outliers, 12, s.pad);
  Buf out = backward ? poisoned_like(x) : poisoned_like(dy);
  Buf want = poisoned_like(out);
  if (backward) {
    if (vec && silu_and_mul_backward_cuda_vec16_applicable(out.dev_view(), dy.dev_view(), x.dev_view()))
      return;
    silu_and_mul_backward_reference(kCpuCtx, want.host_view(), dy.host_view(), x.host_view());
    (vec ? silu_and_mul_backward_cuda_vec16 : silu_and_mul_backward_cuda)(kGpuCtx, out.dev_view(),
                                                                          dy.dev_view(), x.dev_view());
  } else {
    if (vec && silu_and_mul_cuda_vec16_applicable(out.dev_view(), x.dev_view())) return;
    silu_and_mul_reference(kCpuCtx, want.host_view(), x.host_view());
    (vec ? silu_and_mul_cuda_vec16 : silu_and_mul_cuda)(kGpuCtx, out.dev_view(), x.dev_view());
  }
  out.download();
  expect_close(out, want, label(backward ? "silu_and_mul_backward" : "silu_and_mul", t, s.rows,
                                s.cols, s.pad, vec));
}

TEST(CudaKernels, SiluAndMulMatchesReference) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const Shape2& s : kSiluShapes)
      for (bool vec : {false, true})
        for (bool backward : {false, true}) check_silu(t, s, vec, backward);
}

// ---- launches back to back (Note [programmatic launch]) ---------------------------------------
// Eight rms_norm calls and a silu_and_mul, each reading what the one before wrote, launched on one
// stream without a host synchronization between them: every kernel waits for the one before (a
// kernel that touched memory before its prologue would read the poisoned buffers or the previous
// step's values).
TEST(CudaKernels, BackToBackLaunchesReadTheWritesBeforeThem) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (bool vec : {false, true}) {
      void* stream = cuda_create_stream(0);
      const Context ctx{kGpu, Stream{stream}};
      const int64_t rows = 300, cols = 4096;
      Buf x = make_buf(rows, cols, t, Fill::normal_outliers, 21);
      Buf w = make_buf(-1, cols, t, Fill::positive, 22);
      Buf step[2] = {poisoned_like(x), poisoned_like(x)};
      Buf want[2] = {poisoned_like(x), poisoned_like(x)};
      Buf out = make_buf(rows, cols / 2, t, Fill::nan, 0), want_out = make_buf(rows, cols / 2, t, Fill::nan, 0);
      auto norm = vec ? rms_norm_cuda_vec16 : rms_norm_cuda;
      const Buf* in = &x;
      for (int i = 0; i < 8; ++i) {
        rms_norm_reference(kCpuCtx, want[i % 2].host_view(), i == 0 ? x.host_view() : want[(i + 1) % 2].host_view(),
                           w.host_view(), 1e-6, 0.0);
        norm(ctx, step[i % 2].dev_view(), in->dev_view(), w.dev_view(), 1e-6, 0.0);
        in = &step[i % 2];
      }
      silu_and_mul_reference(kCpuCtx, want_out.host_view(), want[1].host_view());
      (vec ? silu_and_mul_cuda_vec16 : silu_and_mul_cuda)(ctx, out.dev_view(), step[1].dev_view());
      cuda_destroy_stream(0, stream);  // waits for the stream
      step[1].download();
      out.download();
      const std::string what = std::string(dtype_name(t)) + (vec ? " vec16" : " scalar");
      expect_close(step[1], want[1], "eighth rms_norm, " + what);
      expect_close(out, want_out, "silu_and_mul after it, " + what);
    }
}

// ---- predicates -----------------------------------------------------------------------------------
// Predicates look at views only: host buffers stand in for device ones (runs without a GPU).
TEST(CudaKernels, Vec16PredicatesExplainRejections) {
  auto host = [](int64_t rows, int64_t cols, DType t, int64_t pad = 0, int64_t offset = 0) {
    return make_buf(rows, cols, t, Fill::positive, 1, pad, offset, false);
  };
  Buf x = host(4, 4096, DType::bf16, 0, 0);
  Buf w = host(-1, 4096, DType::bf16);
  EXPECT_EQ(rms_norm_cuda_vec16_applicable(x.host_view(), x.host_view(), w.host_view(), 1e-6, 0), nullptr);
  Buf odd = host(4, 4095, DType::bf16);
  Buf odd_w = host(-1, 4095, DType::bf16);
  EXPECT_STREQ(rms_norm_cuda_vec16_applicable(odd.host_view(), odd.host_view(), odd_w.host_view(), 1e-6, 0),
               "hidden % 8 != 0");
  Buf shifted = host(4, 4096, DType::bf16, 0, 1);  // base + 2 bytes
  EXPECT_STREQ(rms_norm_cuda_vec16_applicable(shifted.host_view(), shifted.host_view(), w.host_view(), 1e-6, 0),
               "a data pointer is not 16-byte aligned");
  Buf padded = host(4, 4096, DType::bf16, 3);
  EXPECT_STREQ(rms_norm_cuda_vec16_applicable(padded.host_view(), padded.host_view(), w.host_view(), 1e-6, 0),
               "row stride % 8 != 0");
  Buf wide = host(1, 20000, DType::bf16);
  Buf wide_w = host(-1, 20000, DType::bf16);
  EXPECT_NE(rms_norm_cuda_vec16_applicable(wide.host_view(), wide.host_view(), wide_w.host_view(), 1e-6, 0),
            nullptr);
  Buf f64 = host(2, 8, DType::f64);
  Buf f64_w = host(-1, 8, DType::f64);
  EXPECT_STREQ(rms_norm_cuda_applicable(f64.host_view(), f64.host_view(), f64_w.host_view(), 1e-6, 0),
               "dtype is not f32, f16 or bf16");
  Buf sx = host(2, 2 * 333, DType::f16);
  Buf sy = host(2, 333, DType::f16);
  EXPECT_STREQ(silu_and_mul_cuda_vec16_applicable(sy.host_view(), sx.host_view()), "d % 8 != 0");
}

// ---- more than 2^31 elements ---------------------------------------------------------------------
// Rows of a fixed random table at shifting offsets: cheap to build, rows differ.
Tensor big_host_rows(int64_t rows, int64_t cols, DType t) {
  std::vector<uint16_t> table(size_t(1) << 16);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& v : table) v = bf16_t(normal(rng)).bits;
  Tensor h = Tensor::empty(Shape{rows, cols}, t);
  auto* p = h.ptr<uint16_t>();
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(p + r * cols, table.data() + (r * 131) % (int64_t(table.size()) - cols), size_t(cols) * 2);
  return h;
}

// Rows [first, first + n) of a device tensor, copied to the host.
Tensor rows_to_host(const Tensor& dev, int64_t first, int64_t n) {
  const int64_t cols = dev.shape()[1];
  TensorView v(static_cast<char*>(dev.data()) + first * cols * dev.view().itemsize(), dev.dtype(),
               Shape{n, cols}, dev.device());
  return Tensor::copy_of(v, Device::cpu(), dev.dtype());
}

Buf as_buf(Tensor t) {
  Buf b;
  b.dtype = t.dtype(), b.rows = t.shape()[0], b.cols = t.shape()[1];
  b.host = std::move(t);
  return b;
}

TEST(CudaKernels, SiluAndMulBeyond2Pow31Elements) {
  REQUIRE_CUDA();
  const int64_t d = 4096, rows = (int64_t(1) << 31) / (2 * d) + 3;  // x: 2^31 + 3 * 8192 elements
  const int64_t x_bytes = rows * 2 * d * 2;
  if (cuda_free_memory_bytes(0) < 2 * x_bytes + x_bytes / 2 + (int64_t(1) << 30))
    GTEST_SKIP() << "needs about " << (5 * x_bytes / 2) / (1 << 30) + 1 << " GiB of free device memory";
  Tensor x_host = big_host_rows(rows, 2 * d, DType::bf16);
  Tensor x = Tensor::copy_of(x_host.view(), kGpu, DType::bf16);
  Tensor y = Tensor::empty(Shape{rows, d}, DType::bf16, kGpu);
  Tensor dx = Tensor::empty(Shape{rows, 2 * d}, DType::bf16, kGpu);
  for (bool vec : {true, false}) {
    (vec ? silu_and_mul_cuda_vec16 : silu_and_mul_cuda)(kGpuCtx, y, x);
    (vec ? silu_and_mul_backward_cuda_vec16 : silu_and_mul_backward_cuda)(kGpuCtx, dx, y, x);
    for (int64_t first : {int64_t(0), rows - 4}) {
      TensorView xs(x_host.ptr<uint16_t>() + first * 2 * d, DType::bf16, Shape{4, 2 * d});
      Buf got_y = as_buf(rows_to_host(y, first, 4)), got_dx = as_buf(rows_to_host(dx, first, 4));
      Buf want_y = as_buf(Tensor::empty(Shape{4, d}, DType::bf16));
      Buf want_dx = as_buf(Tensor::empty(Shape{4, 2 * d}, DType::bf16));
      silu_and_mul_reference(kCpuCtx, want_y.host.view(), xs);
      silu_and_mul_backward_reference(kCpuCtx, want_dx.host.view(), got_y.host.view(), xs);
      const std::string what = std::string(vec ? "vec16" : "scalar") + " rows from " + std::to_string(first);
      expect_close(got_y, want_y, "silu_and_mul " + what);
      expect_close(got_dx, want_dx, "silu_and_mul_backward " + what);
    }
  }
}

TEST(CudaKernels, RmsNormInPlaceBeyond2Pow31Elements) {
  REQUIRE_CUDA();
  const int64_t hidden = 4096, rows = (int64_t(1) << 31) / hidden + 5;
  if (cuda_free_memory_bytes(0) < rows * hidden * 2 + (int64_t(1) << 30))
    GTEST_SKIP() << "needs about 5 GiB of free device memory";
  Tensor x_host = big_host_rows(rows, hidden, DType::bf16);
  Tensor x = Tensor::copy_of(x_host.view(), kGpu, DType::bf16);
  Buf w = make_buf(-1, hidden, DType::bf16, Fill::positive, 3);
  rms_norm_cuda_vec16(kGpuCtx, x, x, w.dev_view(), 1e-6, 0.0);
  for (int64_t first : {int64_t(0), rows - 4}) {
    TensorView xs(x_host.ptr<uint16_t>() + first * hidden, DType::bf16, Shape{4, hidden});
    Buf want = as_buf(Tensor::empty(Shape{4, hidden}, DType::bf16));
    rms_norm_reference(kCpuCtx, want.host.view(), xs, w.host_view(), 1e-6, 0.0);
    expect_close(as_buf(rows_to_host(x, first, 4)), want, "rms_norm in place rows from " + std::to_string(first));
  }
}

// ---- linear --------------------------------------------------------------------------------------
// cuBLASLt and the tiled kernel on odd sizes, padded rows and bases misaligned by one element (the
// MIN_ALIGNMENT preferences must steer the heuristic to an algorithm that handles them); the
// padding of y stays NaN. Two calls give the same bits (the algorithm is cached per shape).
struct LinearShape {
  int64_t m, n, k, pad, offset;
  bool bias;
};
const LinearShape kLinearShapes[] = {{4, 32, 64, 0, 0, true},  {7, 5, 33, 0, 0, false}, {3, 9, 67, 3, 1, true},
                                     {1, 1, 1, 0, 0, true},    {5, 3, 0, 0, 0, true},   {17, 257, 129, 5, 1, true},
                                     {64, 96, 4096, 0, 0, false}};

void check_linear(DType t, const LinearShape& s, bool cublaslt) {
  Buf x = make_buf(s.m, s.k, t, Fill::normal_outliers, 21, s.pad, s.offset);
  Buf w = make_buf(s.n, s.k, t, Fill::normal_outliers, 22, s.pad, s.offset);
  Buf b = make_buf(-1, s.n, t, Fill::normal_outliers, 23);
  Buf y = make_buf(s.m, s.n, t, Fill::nan, 24, s.pad, s.offset);
  Buf want = poisoned_like(y);
  const TensorView none;
  linear_reference(kCpuCtx, want.host_view(), x.host_view(), w.host_view(), s.bias ? b.host_view() : none);
  auto run = [&] {
    (cublaslt ? linear_cuda_cublaslt : linear_cuda)(kGpuCtx, y.dev_view(), x.dev_view(), w.dev_view(),
                                                    s.bias ? b.dev_view() : none);
  };
  run();
  y.download();
  const std::string what = std::string(cublaslt ? "linear_cuda_cublaslt " : "linear_cuda ") + dtype_name(t) +
                           " m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " +
                           std::to_string(s.k) + " pad " + std::to_string(s.pad) + " offset " +
                           std::to_string(s.offset);
  // f32 sums of k products in another order than the reference's double sum.
  expect_close(y, want, what, t == DType::f32 ? 1e-4 * std::sqrt(double(std::max<int64_t>(s.k, 1))) : 0);
  const Tensor first = Tensor::copy_of(y.host.view(), Device::cpu(), t);
  run();
  y.download();
  EXPECT_EQ(std::memcmp(first.data(), y.host.data(), size_t(y.host.view().numel() * dtype_size(t))), 0)
      << what << ": two calls differ";
}

// Two tests, so that scripts/gpu-check.sh can leave the cuBLASLt one out of racecheck (which
// reports shared-memory hazards inside cuBLAS's own split-K kernels, code opforge cannot change).
TEST(CudaKernels, LinearCublasLtMatchesReference) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const LinearShape& s : kLinearShapes) check_linear(t, s, true);
}
TEST(CudaKernels, LinearTiledMatchesReference) {
  REQUIRE_CUDA();
  for (DType t : kDTypes)
    for (const LinearShape& s : kLinearShapes) check_linear(t, s, false);
}

// ---- embedding -----------------------------------------------------------------------------------
// Device ids are not range-checked by the op's check: an id outside [0, vocab) gives a row of zeros
// in the forward and no contribution in the backward, and nothing is read or written out of bounds.
TEST(CudaKernels, EmbeddingIdsOutOfRangeOnTheDevice) {
  REQUIRE_CUDA();
  const int64_t vocab = 5, dim = 16, tokens = 6;
  const int64_t ids_host[tokens] = {1, -3, 4, 7, 1, 2};
  Tensor ids_cpu = Tensor::empty(Shape{tokens}, DType::i64);
  std::memcpy(ids_cpu.data(), ids_host, sizeof(ids_host));
  Tensor ids = Tensor::copy_of(ids_cpu.view(), kGpu, DType::i64);
  for (DType t : kDTypes) {
    Buf w = make_buf(vocab, dim, t, Fill::normal_outliers, 31);
    Buf y = make_buf(tokens, dim, t, Fill::nan, 32);
    for (bool vec : {true, false}) {
      (vec ? embedding_cuda_vec16 : embedding_cuda)(kGpuCtx, y.dev_view(), ids.view(), w.dev_view(), -1);
      y.download();
      for (int64_t i = 0; i < tokens; ++i)
        for (int64_t c = 0; c < dim; ++c) {
          const int64_t id = ids_host[i];
          const double want = id >= 0 && id < vocab ? w.at(id, c) : 0.0;
          ASSERT_EQ(y.at(i, c), want) << dtype_name(t) << " token " << i << " col " << c;
        }
      Buf dy = make_buf(tokens, dim, t, Fill::normal_outliers, 33);
      Buf dw = make_buf(vocab, dim, t, Fill::nan, 34);
      (vec ? embedding_backward_cuda_vec16 : embedding_backward_cuda)(kGpuCtx, dw.dev_view(), dy.dev_view(),
                                                                      ids.view(), w.dev_view(), -1);
      dw.download();
      for (int64_t c = 0; c < dim; ++c) {
        EXPECT_EQ(dw.at(0, c), 0.0);
        EXPECT_EQ(dw.at(3, c), 0.0);
        EXPECT_NEAR(dw.at(4, c), dy.at(2, c), 0.0);
        EXPECT_NEAR(dw.at(1, c), dy.at(0, c) + dy.at(4, c), 0.02 * (1 + std::fabs(dy.at(0, c) + dy.at(4, c))));
      }
    }
  }
}

// ---- timing (run explicitly: --gtest_also_run_disabled_tests --gtest_filter='CudaKernelsTiming.*')
// Two timings: events around 20 back-to-back calls (host enqueue gaps included when the host is
// slower than the kernel) and 20 calls replayed from a CUDA graph (the device's time per call).
void report_time(const std::string& what, double bytes, const std::function<void()>& fn) {
  const double us = cuda_median_us(0, fn, 20, 30, 20);
  const double graph_us = cuda_graph_median_us(0, fn, 30, 20);
  std::printf("| %-44s | %9.2f | %9.2f | %8.1f |\n", what.c_str(), us, graph_us,
              bytes / (graph_us > 0 ? graph_us : us) / 1e3);
}

TEST(CudaKernelsTiming, DISABLED_Table) {
  REQUIRE_CUDA();
  std::printf("| kernel (bf16) | median us, stream | median us, graph | GB/s (graph) |\n|---|---|---|---|\n");
  for (int64_t tokens : {1, 16, 1024, 16384}) {
    const int64_t h = 4096;
    Buf x = make_buf(tokens, h, DType::bf16, Fill::normal_outliers, 1);
    Buf r = make_buf(tokens, h, DType::bf16, Fill::normal_outliers, 2);
    Buf w = make_buf(-1, h, DType::bf16, Fill::positive, 3);
    Buf y = poisoned_like(x), s = poisoned_like(x), dx = poisoned_like(x), dw = poisoned_like(w);
    const double row_bytes = double(tokens * h * 2);
    const std::string shape = " [" + std::to_string(tokens) + ", 4096]";
    for (bool vec : {true, false}) {
      const char* impl = vec ? "_cuda_vec16" : "_cuda";
      report_time(std::string("rms_norm") + impl + shape, 2 * row_bytes, [&] {
        (vec ? rms_norm_cuda_vec16 : rms_norm_cuda)(kGpuCtx, y.dev_view(), x.dev_view(), w.dev_view(), 1e-6, 0.0);
      });
      report_time(std::string("fused_add_rms_norm") + impl + shape, 4 * row_bytes, [&] {
        (vec ? fused_add_rms_norm_cuda_vec16 : fused_add_rms_norm_cuda)(
            kGpuCtx, y.dev_view(), s.dev_view(), x.dev_view(), r.dev_view(), w.dev_view(), 1e-6, 0.0);
      });
      report_time(std::string("rms_norm_backward") + impl + shape, 3 * row_bytes, [&] {
        (vec ? rms_norm_backward_cuda_vec16 : rms_norm_backward_cuda)(
            kGpuCtx, dx.dev_view(), dw.dev_view(), r.dev_view(), x.dev_view(), w.dev_view(), 1e-6, 0.0);
      });
    }
  }
  for (int64_t tokens : {1, 16, 1024, 4096}) {
    const int64_t d = 14336;
    Buf x = make_buf(tokens, 2 * d, DType::bf16, Fill::normal_outliers, 1);
    Buf y = make_buf(tokens, d, DType::bf16, Fill::normal_outliers, 2);
    Buf dx = poisoned_like(x);
    const double bytes = double(tokens * d * 2);
    const std::string shape = " [" + std::to_string(tokens) + ", 2x14336]";
    for (bool vec : {true, false}) {
      const char* impl = vec ? "_cuda_vec16" : "_cuda";
      report_time(std::string("silu_and_mul") + impl + shape, 3 * bytes, [&] {
        (vec ? silu_and_mul_cuda_vec16 : silu_and_mul_cuda)(kGpuCtx, y.dev_view(), x.dev_view());
      });
      report_time(std::string("silu_and_mul_backward") + impl + shape, 5 * bytes, [&] {
        (vec ? silu_and_mul_backward_cuda_vec16 : silu_and_mul_backward_cuda)(
            kGpuCtx, dx.dev_view(), y.dev_view(), x.dev_view());
      });
    }
  }
}

}  // namespace

#endif  // OPFORGE_WITH_CUDA
