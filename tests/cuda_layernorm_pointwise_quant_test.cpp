// CUDA kernels of layer_norm (+ backward), the pointwise activations, swigluoai_and_mul and
// quant_fp8, taken from the registry and called directly: what the harness's cases do not reach.
//  - Predicates (views only; host buffers stand in for device ones, so these run without a GPU).
//  - quant_fp8 bit-exact against the reference on special values (NaN of either sign,
//    infinities, values past +-448, subnormal e4m3 results, zeros) in every mode.
//  - layer_norm_backward: dw and db bit-identical over repeated calls, zero for no rows.
//  - the pointwise ops in place (y = x, dx = dy) against out-of-place results.
// Device tests skip with the probe's reason when no usable CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "opforge/registry.h"
#include "opforge/tensor.h"

#ifdef OPFORGE_WITH_CUDA

#include "backends/cuda/cuda_backend.h"
#include "ops/activation/activation.h"
#include "ops/layernorm/layernorm.h"
#include "ops/quant/internal.h"

namespace opforge {
namespace {

const Device kGpu = Device::cuda(0);
const Context kGpuCtx{Device::cuda(0), Stream{}};
const Context kCpuCtx{};

#define REQUIRE_CUDA()                                           \
  do {                                                           \
    Availability a = cuda_availability();                        \
    if (!a.ok) GTEST_SKIP() << "CUDA unavailable: " << a.reason; \
    (void)global_registry(); /* installs the device memory hooks */ \
  } while (0)

// The typed kernel and predicate of one registered CUDA kernel of Op.
template <class Op> struct Cuda {
  typename OpTraits<Op>::Kernel* fn = nullptr;
  typename OpTraits<Op>::Predicate* ok = nullptr;
};
template <class Op> Cuda<Op> cuda_kernel(const char* impl) {
  const KernelEntry* k = global_registry().op(Op::name).kernel(impl, DeviceKind::cuda);
  EXPECT_NE(k, nullptr) << Op::name << " " << impl;
  Cuda<Op> c;
  if (!k) return c;
  c.fn = reinterpret_cast<typename OpTraits<Op>::Kernel*>(k->fn);
  c.ok = reinterpret_cast<typename OpTraits<Op>::Predicate*>(k->predicate);
  return c;
}

// A host tensor [rows, cols] with rows `cols + pad` apart, starting `offset` elements into its
// buffer (offset 1 misaligns the base). rows < 0: a [cols] vector.
struct Mat {
  Tensor buf;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0, pad = 0, offset = 0;
  TensorView view_of(const Tensor& t, Device d) const {
    char* p = static_cast<char*>(t.data()) + offset * dtype_size(dtype);
    if (rows < 0) return TensorView(p, dtype, Shape{cols}, d);
    const int64_t strides[] = {cols + pad, 1};
    return TensorView(p, dtype, Shape{rows, cols}, strides, d);
  }
  TensorView host() const { return view_of(buf, Device::cpu()); }
};
Mat mat(int64_t rows, int64_t cols, DType t, int64_t pad = 0, int64_t offset = 0, uint32_t seed = 1) {
  Mat m;
  m.dtype = t, m.rows = rows, m.cols = cols, m.pad = pad, m.offset = offset;
  const int64_t n = offset + (rows < 0 ? 1 : rows) * (cols + pad);
  m.buf = Tensor::empty(Shape{n}, t);
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < n; ++i) store_from_double(m.buf.data(), t, i, normal(rng));
  return m;
}
Tensor to_gpu(const Mat& m) { return Tensor::copy_of(m.buf.view(), kGpu, m.dtype); }
Tensor to_host(const Tensor& d) { return Tensor::copy_of(d.view(), Device::cpu(), d.dtype()); }
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.view().numel() == b.view().numel() &&
         std::memcmp(a.data(), b.data(), size_t(a.view().numel() * a.view().itemsize())) == 0;
}

// The bytes that differ (at most 8), with the input element each came from: "" when equal.
std::string byte_diffs(const Tensor& got, const Tensor& want, const Mat& x) {
  std::string out;
  const auto* g = static_cast<const uint8_t*>(got.data());
  const auto* w = static_cast<const uint8_t*>(want.data());
  int shown = 0;
  for (int64_t i = 0; i < want.view().numel() && shown < 8; ++i)
    if (g[i] != w[i]) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " [%lld] got 0x%02x want 0x%02x (x %g)", static_cast<long long>(i), g[i], w[i],
                    load_as_double(x.buf.data(), x.dtype, i));
      out += buf;
      ++shown;
    }
  return out;
}

// ---- predicates (no GPU needed) -------------------------------------------------------------------
TEST(CudaEwPredicates, LayerNorm) {
  const auto fwd = cuda_kernel<LayerNorm>("cuda_vec16");
  const auto bwd = cuda_kernel<LayerNormBackward>("cuda_vec16");
  const auto scalar = cuda_kernel<LayerNorm>("cuda");
  ASSERT_TRUE(fwd.ok && bwd.ok && scalar.ok);
  Mat x = mat(4, 4096, DType::bf16), w = mat(-1, 4096, DType::bf16), b = mat(-1, 4096, DType::bf16);
  EXPECT_EQ(fwd.ok(x.host(), x.host(), w.host(), b.host(), 1e-5), nullptr);
  EXPECT_EQ(fwd.ok(x.host(), x.host(), w.host(), TensorView{}, 1e-5), nullptr);  // no bias
  EXPECT_EQ(bwd.ok(x.host(), w.host(), b.host(), x.host(), x.host(), w.host(), 1e-5), nullptr);
  Mat odd = mat(4, 4095, DType::bf16), odd_w = mat(-1, 4095, DType::bf16);
  EXPECT_STREQ(fwd.ok(odd.host(), odd.host(), odd_w.host(), TensorView{}, 1e-5), "hidden % 8 != 0");
  Mat shifted = mat(4, 4096, DType::bf16, 0, 1);
  EXPECT_STREQ(fwd.ok(shifted.host(), shifted.host(), w.host(), TensorView{}, 1e-5),
               "a data pointer is not 16-byte aligned");
  Mat padded = mat(4, 4096, DType::bf16, 3);
  EXPECT_STREQ(fwd.ok(padded.host(), padded.host(), w.host(), TensorView{}, 1e-5), "row stride % 8 != 0");
  Mat b_shifted = mat(-1, 4096, DType::bf16, 0, 1);
  EXPECT_STREQ(fwd.ok(x.host(), x.host(), w.host(), b_shifted.host(), 1e-5), "b is not 16-byte aligned");
  // hidden 16384 bf16 = 2048 packs: the forward holds it, the backward (1024 packs) does not.
  Mat wide = mat(1, 16384, DType::bf16), wide_w = mat(-1, 16384, DType::bf16);
  EXPECT_EQ(fwd.ok(wide.host(), wide.host(), wide_w.host(), TensorView{}, 1e-5), nullptr);
  EXPECT_STREQ(bwd.ok(wide.host(), wide_w.host(), wide_w.host(), wide.host(), wide.host(), wide_w.host(), 1e-5),
               "hidden exceeds a register-resident row (1024 packs)");
  Mat f64 = mat(2, 8, DType::f64), f64_w = mat(-1, 8, DType::f64);
  EXPECT_STREQ(scalar.ok(f64.host(), f64.host(), f64_w.host(), TensorView{}, 1e-5),
               "dtype is not f32, f16 or bf16");
}

TEST(CudaEwPredicates, PointwiseSwigluQuant) {
  const auto gelu = cuda_kernel<GeluNew>("cuda_vec16");
  const auto oai = cuda_kernel<SwigluoaiAndMul>("cuda_vec16");
  const auto quant = cuda_kernel<QuantFp8>("cuda_vec16");
  ASSERT_TRUE(gelu.ok && oai.ok && quant.ok);
  Mat x = mat(3, 64, DType::f16);
  EXPECT_EQ(gelu.ok(x.host(), x.host()), nullptr);
  Mat odd = mat(3, 63, DType::f16);
  EXPECT_STREQ(gelu.ok(odd.host(), odd.host()), "row length % 8 != 0");
  Mat f32_odd = mat(3, 6, DType::f32);
  EXPECT_STREQ(gelu.ok(f32_odd.host(), f32_odd.host()), "row length % 4 != 0");
  Mat ox = mat(2, 2 * 12, DType::bf16), oy = mat(2, 12, DType::bf16);
  EXPECT_STREQ(oai.ok(oy.host(), ox.host(), 1.702, 7.0), "d % 8 != 0");
  Mat ox16 = mat(2, 2 * 16, DType::bf16), oy16 = mat(2, 16, DType::bf16);
  EXPECT_EQ(oai.ok(oy16.host(), ox16.host(), 1.702, 7.0), nullptr);
  Mat qx = mat(4, 64, DType::bf16);
  Mat q = mat(4, 64, DType::f8e4m3), q_padded = mat(4, 64, DType::f8e4m3, 4);
  Mat scale = mat(-1, 1, DType::f32);
  EXPECT_EQ(quant.ok(q.host(), scale.host(), qx.host(), TensorView{}, "per_tensor", 0), nullptr);
  EXPECT_STREQ(quant.ok(q_padded.host(), scale.host(), qx.host(), TensorView{}, "per_tensor", 0),
               "q row stride % 8 != 0");
}

// ---- quant_fp8: special values, bit-exact ---------------------------------------------------------
void fill_nan(Mat& m) {
  for (int64_t i = 0; i < m.buf.view().numel(); ++i)
    store_from_double(m.buf.data(), m.dtype, i, std::numeric_limits<double>::quiet_NaN());
}

void check_quant_special(DType t, const char* impl, const std::string& mode) {
  const auto k = cuda_kernel<QuantFp8>(impl);
  ASSERT_TRUE(k.fn);
  const int64_t rows = 6, cols = 40;  // 40: a multiple of 8 (vec16 for every dtype)
  Mat x = mat(rows, cols, t, 0, 0, 7);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double specials[] = {nan, -nan, inf, -inf, 0.0, -0.0, 1e-30, -3e-3, 500.0, -449.0, 465.0};
  // per_tensor: no infinity (its scale would be infinite and every finite q zero); the largest
  // value 1e4 then leaves most of q in the e4m3 subnormal range.
  for (int64_t i = 0; i < int64_t(std::size(specials)); ++i) {
    const double v = specials[i];
    store_from_double(x.buf.data(), t, i, mode == "per_tensor" && std::isinf(v) ? v / inf * 2e3 : v);
  }
  store_from_double(x.buf.data(), t, 1 * cols + 3, -nan);
  store_from_double(x.buf.data(), t, 2 * cols + 5, 1e4);
  for (int64_t c = 0; c < cols; ++c) store_from_double(x.buf.data(), t, 5 * cols + c, 0.0);  // zero row
  const bool per_token = mode == "per_token", is_static = mode == "static";
  Mat q_want = mat(rows, cols, DType::f8e4m3), q_got = mat(rows, cols, DType::f8e4m3);
  Mat s_want = per_token ? mat(rows, 1, DType::f32) : mat(-1, 1, DType::f32);
  Mat s_got = per_token ? mat(rows, 1, DType::f32) : mat(-1, 1, DType::f32);
  fill_nan(s_got);
  Mat st = mat(-1, 1, DType::f32);
  store_from_double(st.buf.data(), DType::f32, 0, 0.0625);
  quant_fp8_reference(kCpuCtx, q_want.host(), s_want.host(), x.host(),
                      is_static ? st.host() : TensorView{}, mode, 0);
  Tensor dx = to_gpu(x), dq = to_gpu(q_got), ds = to_gpu(s_got), dst = to_gpu(st);
  const TensorView st_dev = is_static ? st.view_of(dst, kGpu) : TensorView{};
  if (k.ok(q_got.view_of(dq, kGpu), s_got.view_of(ds, kGpu), x.view_of(dx, kGpu), st_dev, mode, 0))
    return;  // not this kernel's layout
  k.fn(kGpuCtx, q_got.view_of(dq, kGpu), s_got.view_of(ds, kGpu), x.view_of(dx, kGpu), st_dev, mode, 0);
  const std::string what = std::string(impl) + " " + dtype_name(t) + " " + mode;
  EXPECT_EQ(byte_diffs(to_host(dq), q_want.buf, x), "") << what << ": q differs from the reference";
  EXPECT_TRUE(same_bytes(to_host(ds), s_want.buf)) << what << ": scale differs from the reference";
}

TEST(CudaEwKernels, QuantFp8SpecialValuesBitExact) {
  REQUIRE_CUDA();
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (const char* impl : {"cuda", "cuda_vec16"})
      for (const char* mode : {"per_tensor", "per_token", "static"}) check_quant_special(t, impl, mode);
}

// ---- layer_norm_backward: deterministic dw / db ---------------------------------------------------
TEST(CudaEwKernels, LayerNormBackwardDeterministicAndEmpty) {
  REQUIRE_CUDA();
  for (const char* impl : {"cuda", "cuda_vec16"}) {
    const auto k = cuda_kernel<LayerNormBackward>(impl);
    ASSERT_TRUE(k.fn);
    for (int64_t rows : {int64_t(0), int64_t(3000)}) {
      Mat x = mat(rows, 1024, DType::f32, 0, 0, 3), dy = mat(rows, 1024, DType::f32, 0, 0, 4);
      Mat w = mat(-1, 1024, DType::f32, 0, 0, 5), dw = mat(-1, 1024, DType::f32), db = mat(-1, 1024, DType::f32);
      fill_nan(dw), fill_nan(db);
      Tensor gx = to_gpu(x), gdy = to_gpu(dy), gw = to_gpu(w), gdx = to_gpu(x);
      Tensor gdw = to_gpu(dw), gdb = to_gpu(db);
      std::vector<Tensor> first;
      for (int run = 0; run < 3; ++run) {
        k.fn(kGpuCtx, x.view_of(gdx, kGpu), dw.view_of(gdw, kGpu), db.view_of(gdb, kGpu),
             dy.view_of(gdy, kGpu), x.view_of(gx, kGpu), w.view_of(gw, kGpu), 1e-5);
        Tensor hw = to_host(gdw), hb = to_host(gdb);
        if (run == 0) {
          if (rows == 0) {
            for (int64_t i = 0; i < 1024; ++i) {
              EXPECT_EQ(load_as_double(hw.data(), DType::f32, i), 0.0) << impl << " dw of no rows";
              EXPECT_EQ(load_as_double(hb.data(), DType::f32, i), 0.0) << impl << " db of no rows";
            }
          }
          first.push_back(std::move(hw)), first.push_back(std::move(hb));
        } else {
          EXPECT_TRUE(same_bytes(hw, first[0])) << impl << " dw differs between calls";
          EXPECT_TRUE(same_bytes(hb, first[1])) << impl << " db differs between calls";
        }
      }
    }
  }
}

// Note [shifted sums] (ops/layernorm/cuda_fast.cu): rowblock's one-reduction statistics shift by
// each row's first element and fall back to the centred form when that element is far from the
// mean. Rows with an outlier first element (fallback) and plain rows (shifted sums) against the
// reference kernel on the host, in f32.
TEST(CudaEwKernels, LayerNormRowblockOutlierFirstElement) {
  REQUIRE_CUDA();
  const auto k = cuda_kernel<LayerNorm>("cuda_vec16_rowblock");
  const auto ref = global_registry().op(LayerNorm::name).kernel("reference", DeviceKind::cpu);
  ASSERT_TRUE(k.fn && ref);
  const int64_t rows = 256, hidden = 4096;  // rowblock takes 128 rows and more
  Mat x = mat(rows, hidden, DType::f32, 0, 0, 21), w = mat(-1, hidden, DType::f32, 0, 0, 22);
  Mat b = mat(-1, hidden, DType::f32, 0, 0, 23), y = mat(rows, hidden, DType::f32);
  for (int64_t r = 0; r < rows; r += 2) store_from_double(x.buf.data(), DType::f32, r * hidden, 3000.0);
  for (int64_t r = 1; r < rows; r += 4) store_from_double(x.buf.data(), DType::f32, r * hidden + 5, -2000.0);
  ASSERT_EQ(k.ok(y.host(), x.host(), w.host(), b.host(), 1e-5), nullptr);
  Tensor gx = to_gpu(x), gw = to_gpu(w), gb = to_gpu(b), gy = to_gpu(y);
  k.fn(kGpuCtx, y.view_of(gy, kGpu), x.view_of(gx, kGpu), w.view_of(gw, kGpu), b.view_of(gb, kGpu), 1e-5);
  const Tensor got = to_host(gy);
  auto* ref_fn = reinterpret_cast<OpTraits<LayerNorm>::Kernel*>(ref->fn);
  ref_fn(kCpuCtx, y.host(), x.host(), w.host(), b.host(), 1e-5);
  double worst = 0;
  for (int64_t i = 0; i < rows * hidden; ++i) {
    const double want = load_as_double(y.buf.data(), DType::f32, i), have = load_as_double(got.data(), DType::f32, i);
    worst = std::max(worst, std::abs(have - want) / (1.0 + std::abs(want)));
  }
  EXPECT_LT(worst, 2e-5);
}

// Note [layer_norm backward in one reduction] (ops/layernorm/cuda_backward_bulk.cu) and Note
// [few-row layer_norm backward cluster] (cuda_backward_cluster.cu) shift each row's sums by its
// first element and reduce again, centred, when that element is far from the mean. f32 rows with
// an outlier first element (second reduction) and plain rows, against the host reference.
void check_layer_norm_backward_outliers(int64_t rows, int64_t hidden) {
  SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(hidden));
  const auto k = cuda_kernel<LayerNormBackward>("cuda_vec16_async");
  const auto ref = global_registry().op(LayerNormBackward::name).kernel("reference", DeviceKind::cpu);
  ASSERT_TRUE(k.fn && ref);
  Mat x = mat(rows, hidden, DType::f32, 0, 0, 31), dy = mat(rows, hidden, DType::f32, 0, 0, 32);
  Mat w = mat(-1, hidden, DType::f32, 0, 0, 33), dx = mat(rows, hidden, DType::f32);
  Mat dw = mat(-1, hidden, DType::f32), db = mat(-1, hidden, DType::f32);
  for (int64_t r = 0; r < rows; r += 2) store_from_double(x.buf.data(), DType::f32, r * hidden, 3000.0);
  for (int64_t r = 1; r < rows; r += 4) store_from_double(x.buf.data(), DType::f32, r * hidden + 5, -2000.0);
  ASSERT_EQ(k.ok(dx.host(), dw.host(), db.host(), dy.host(), x.host(), w.host(), 1e-5), nullptr);
  Tensor gx = to_gpu(x), gdy = to_gpu(dy), gw = to_gpu(w), gdx = to_gpu(dx), gdw = to_gpu(dw), gdb = to_gpu(db);
  k.fn(kGpuCtx, dx.view_of(gdx, kGpu), dw.view_of(gdw, kGpu), db.view_of(gdb, kGpu), dy.view_of(gdy, kGpu),
       x.view_of(gx, kGpu), w.view_of(gw, kGpu), 1e-5);
  const Tensor got_dx = to_host(gdx), got_dw = to_host(gdw), got_db = to_host(gdb);
  auto* ref_fn = reinterpret_cast<OpTraits<LayerNormBackward>::Kernel*>(ref->fn);
  ref_fn(kCpuCtx, dx.host(), dw.host(), db.host(), dy.host(), x.host(), w.host(), 1e-5);
  auto worst = [](const Mat& want, const Tensor& have, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double a = load_as_double(want.buf.data(), DType::f32, i), b = load_as_double(have.data(), DType::f32, i);
      e = std::max(e, std::abs(b - a) / (1.0 + std::abs(a)));
    }
    return e;
  };
  EXPECT_LT(worst(dx, got_dx, rows * hidden), 1e-4);
  EXPECT_LT(worst(dw, got_dw, hidden), 1e-3);  // sums over up to 4,096 rows in f32
  EXPECT_LT(worst(db, got_db, hidden), 1e-3);
}

// 4,096 rows: the bulk-copy pipeline on an H100 / H200. 1, 5 and 16 rows: the cluster (one row a
// thread at 1 and 5, two at 16 x 4,096 f32; CTAs of 128 to 1,024 threads). 32 rows: the ring kernel.
TEST(CudaEwKernels, LayerNormBackwardOutlierFirstElement) {
  REQUIRE_CUDA();
  check_layer_norm_backward_outliers(4096, 1024);
  check_layer_norm_backward_outliers(1, 4096);
  check_layer_norm_backward_outliers(5, 1024);
  check_layer_norm_backward_outliers(16, 4096);
  check_layer_norm_backward_outliers(32, 2048);
}

// ---- pointwise ops in place -----------------------------------------------------------------------
// y = x (forward) and dx = dy (backward) give the bits of the out-of-place calls (padding included:
// every buffer starts as a copy of x or dy, and the padding is never written).
template <class Op, class OpBackward> void check_in_place(const char* impl) {
  const auto f = cuda_kernel<Op>(impl);
  const auto b = cuda_kernel<OpBackward>(impl);
  ASSERT_TRUE(f.fn && b.fn);
  for (DType t : {DType::f32, DType::bf16}) {
    Mat x = mat(5, 72, t, 8, 0, 9), dy = mat(5, 72, t, 8, 0, 10);
    Tensor gx = to_gpu(x), gy = to_gpu(x), gdy = to_gpu(dy), gdx = to_gpu(dy);
    f.fn(kGpuCtx, x.view_of(gy, kGpu), x.view_of(gx, kGpu));
    b.fn(kGpuCtx, dy.view_of(gdx, kGpu), dy.view_of(gdy, kGpu), x.view_of(gx, kGpu));
    const Tensor y_want = to_host(gy), dx_want = to_host(gdx);
    b.fn(kGpuCtx, dy.view_of(gdy, kGpu), dy.view_of(gdy, kGpu), x.view_of(gx, kGpu));  // dx = dy
    f.fn(kGpuCtx, x.view_of(gx, kGpu), x.view_of(gx, kGpu));                          // y = x
    EXPECT_TRUE(same_bytes(to_host(gx), y_want)) << Op::name << " " << impl << " " << dtype_name(t);
    EXPECT_TRUE(same_bytes(to_host(gdy), dx_want)) << OpBackward::name << " " << impl << " " << dtype_name(t);
  }
}

TEST(CudaEwKernels, PointwiseInPlace) {
  REQUIRE_CUDA();
  for (const char* impl : {"cuda", "cuda_vec16"}) {
    check_in_place<GeluNew, GeluNewBackward>(impl);
    check_in_place<GeluFast, GeluFastBackward>(impl);
    check_in_place<QuickGelu, QuickGeluBackward>(impl);
    check_in_place<Relu2, Relu2Backward>(impl);
  }
}

}  // namespace
}  // namespace opforge

#endif  // OPFORGE_WITH_CUDA
