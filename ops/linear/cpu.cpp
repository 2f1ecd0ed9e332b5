// CPU kernels of linear and linear_backward: linear_cpu, linear_backward_cpu.
//
// Assumes: Note [row layout] for x, y, dy, dx and both rows of w / dw (padded rows are passed to
// BLAS as leading dimensions, no copy); f32 / bf16 / f16 (f64 goes to the reference kernel); the
// op's check has run; every dimension and leading dimension below 2^31 (the 32-bit BLAS
// interface of Debian's OpenBLAS; the predicates say so otherwise).
//
// Why it is fast: the products are OpenBLAS's cblas_sgemm (packed, register-blocked, AVX2 /
// AVX-512 micro-kernels), one single-threaded call per OpenMP thread on its block of the output
// (Note [one thread pool], ops/linear/internal.h). f32 runs straight on the tensors; the bias is
// written into y first and the GEMM accumulates onto it (beta = 1).
// bf16 / f16: the Debian OpenBLAS has no sbgemm (see the gemm.cpp section of internal.h), so x is
// widened to f32 once and w in tiles of out-rows (Note [tiling]: all threads' tiles together in
// half the L3, at least 512 rows: Note [narrow gemm]), one OpenMP task per tile: the task widens
// its tile (Highway conversions), multiplies it while it is in cache and rounds its y columns
// once. Decode shapes are bound by reading w: up to 16 rows of x (fewer for long rows) go through
// a dot-product path that reads w once (Note [decode gemv]).
// Deterministic: no product is split over k (Note [one thread pool]) and db sums rows in order.
#include <climits>

#include "backends/cpu/cpu_info.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"
#include "opforge/plan.h"
#include "ops/linear/internal.h"

namespace opforge {

using gemm_cpu::F32Panel;

namespace {

const char* blas_reason(std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes)
    if (s > int64_t(INT_MAX)) return "a size exceeds the 32-bit BLAS interface";
  return nullptr;
}

const char* dtype_reason(const TensorView& x) {
  if (!x.device.is_cpu()) return "tensors are not on the cpu";
  switch (x.dtype) {
    case DType::f32: case DType::bf16: case DType::f16: return nullptr;
    case DType::f64: return "f64 is served by the reference kernel";
    default: return "dtype is not f32, bf16 or f16";
  }
}

// Out-rows of w per task of the 16-bit path: Note [tiling] with every thread's f32 tile in half
// of the (shared) L3 together, but never fewer than kMinGemmColumns.
//
// Note [narrow gemm]: single-threaded cblas_sgemm of Debian's OpenBLAS (0.3.21, Zen kernels) runs
// at about a third of its speed when the output has fewer than 512 columns: on the 2-core EPYC
// development machine, x[128 x 4096] times a w tile transposed ran at 11 GFLOP/s for 64-256
// columns and 31 GFLOP/s for 512-4096 (36-37 at 512 rows of x). An L3-sized tile there is 128
// columns, so the cache rule alone put every bf16 GEMM on the slow path. A wider tile spills the
// widened copy of w to DRAM, which costs its write and one read (some 10% at 128 tokens) instead
// of a factor of three.
constexpr int64_t kMinGemmColumns = 512;

int64_t w_tile_rows(int64_t in) {
  cpu::TileSpec spec;
  spec.bytes_per_element = 4 * std::max(1, cpu::cpu_info().threads);
  spec.multiplier = std::max<int64_t>(in, 1);
  spec.level = cpu::CacheLevel::l3;
  return std::max(cpu::capacity_block(spec), kMinGemmColumns);
}

// y rows = bias (or 0), f32 y only.
void fill_bias(const TensorView& y, const TensorView& b) {
  const int64_t rows = y.rows(), out = y.size(-1), stride = y.row_stride();
  float* yp = static_cast<float*>(y.data);
  const float* bp = b.defined() ? static_cast<const float*>(b.data) : nullptr;
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t m = 0; m < out; ++m) yp[n * stride + m] = bp ? bp[m] : 0.0f;
}

void linear_f32(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& b) {
  const int64_t rows = x.rows(), in = x.size(-1), out = w.size(0);
  if (b.defined() || in == 0) fill_bias(y, b);
  if (in == 0) return;
  gemm_cpu::sgemm(false, true, rows, out, in, static_cast<const float*>(x.data), x.row_stride(),
                    static_cast<const float*>(w.data), w.row_stride(), b.defined() ? 1.0f : 0.0f,
                    static_cast<float*>(y.data), y.row_stride());
}

// One OpenMP region over tiles of w's rows (Note [one thread pool]): each task widens its tile,
// multiplies it on its own thread and rounds its y columns; x is widened once before.
void linear_16bit(const TensorView& y, const TensorView& x, const TensorView& w, const TensorView& b) {
  const int64_t rows = x.rows(), in = x.size(-1), out = w.size(0);
  const F32Panel x32 = gemm_cpu::f32_rows(x, 0, rows);
  const F32Panel b32 = b.defined() ? gemm_cpu::f32_rows(b, 0, 1) : F32Panel{};
  const cpu::RowTasks tiles{out, w_tile_rows(in)};
  cpu::parallel_tasks(tiles.count(), [&](int64_t t) {
    const int64_t m0 = tiles.begin(t), cols = tiles.end(t) - m0;
    std::unique_ptr<float[]> w32(new float[size_t(std::max<int64_t>(cols * in, 1))]);
    std::unique_ptr<float[]> y32(new float[size_t(std::max<int64_t>(rows * cols, 1))]);
    gemm_cpu::widen_block_serial(w, m0, m0 + cols, 0, in, w32.get());
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t j = 0; j < cols; ++j) y32[size_t(n * cols + j)] = b32.data ? b32.data[m0 + j] : 0.0f;
    gemm_cpu::sgemm_serial(false, true, rows, cols, in, x32.data, x32.ld, w32.get(), in,
                           b32.data || in == 0 ? 1.0f : 0.0f, y32.get(), cols);
    gemm_cpu::store_block_serial(y32.get(), cols, y, 0, rows, m0, cols);
  });
}

// Note [decode gemv]: with a few rows of x (decode: one token per sequence) a 16-bit linear is
// bound by reading w once, 2 bytes per weight. The tiled path above widens w into f32 tiles (a
// write and a read of 4 bytes per weight more) and hands OpenBLAS a GEMM of a few rows, which it
// runs at a fraction of its speed; and when the L3 is large (480 MiB reported by the 2-core Xeon
// VM) one tile holds all of w and one thread does everything: Llama-3.1-8B's o_proj (4096 x 4096)
// at one token took 28.5 ms there, 1.2 GB/s. Here each task takes a block of w's rows (Note
// [balanced tasks]: the rows of y are independent), widens one row at a time into an L1-resident
// f32 row and takes its dot product with each row of x (OpenBLAS's sdot, one call per output), so
// w streams from memory once. Same f32 accumulation; each output is one whole-k dot product.
// Up to how many rows: each row of w is dotted with every row of x, so the path's time grows with
// rows x n x k where the GEMM's barely does, and x's f32 rows are re-read once per row of w. The
// bound: 16 rows, fewer where their f32 copy would pass half the L2 (Note [tiling]), and 4 for a
// w that fits half the L2 itself (a router's 8 or 128 rows: nothing to stream, and the GEMM wins).
// Measured on the 2-core Xeon VM (2 MiB of L2 a core, bf16, full-grid linear rows against the
// tiled GEMM path's): at 6-16 tokens 1.1-6.5x faster for every w larger than that (o_proj 4096 x
// 4096: 4.7-10.2 ms against 30-31 ms); at 24 tokens the two paths are even for k = 8192 and for
// Qwen3-30B-A3B's experts (2048 x 768: 1.18x slower), and at 32 most shapes lose (docs/perf/cpu.md).
constexpr int64_t kGemvMinRows = 4, kGemvMaxRows = 16;
int64_t gemv_max_rows(const TensorView& w) {
  const int64_t in = std::max<int64_t>(w.size(-1), 1);
  cpu::TileSpec w_rows;  // rows of w in half the L2
  w_rows.bytes_per_element = w.itemsize();
  w_rows.multiplier = in;
  w_rows.level = cpu::CacheLevel::l2;
  if (w.size(0) <= cpu::capacity_block(w_rows)) return kGemvMinRows;
  cpu::TileSpec x_rows;  // rows of x's f32 copy in half the L2
  x_rows.bytes_per_element = 4;
  x_rows.multiplier = in;
  x_rows.level = cpu::CacheLevel::l2;
  x_rows.max_block = kGemvMaxRows;
  return std::max(kGemvMinRows, cpu::capacity_block(x_rows));
}

void linear_16bit_gemv(const TensorView& y, const TensorView& x, const TensorView& w,
                       const TensorView& b) {
  const int64_t rows = x.rows(), in = x.size(-1), out = w.size(0);
  const F32Panel x32 = gemm_cpu::f32_rows(x, 0, rows);
  const F32Panel b32 = b.defined() ? gemm_cpu::f32_rows(b, 0, 1) : F32Panel{};
  cpu::TileSpec spec;  // a block of w's rows in L2
  spec.bytes_per_element = w.itemsize();
  spec.multiplier = std::max<int64_t>(in, 1);
  spec.level = cpu::CacheLevel::l2;
  const cpu::RowTasks tasks = cpu::balanced({out, cpu::capacity_block(spec)});
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) {
    const int64_t m0 = tasks.begin(t), cols = tasks.end(t) - m0;
    std::unique_ptr<float[]> w32(new float[size_t(std::max<int64_t>(in, 1))]);
    std::unique_ptr<float[]> y32(new float[size_t(std::max<int64_t>(rows * cols, 1))]);
    for (int64_t j = 0; j < cols; ++j) {
      gemm_cpu::widen_block_serial(w, m0 + j, m0 + j + 1, 0, in, w32.get());
      const float bias = b32.data ? b32.data[m0 + j] : 0.0f;
      for (int64_t n = 0; n < rows; ++n)
        y32[size_t(n * cols + j)] = gemm_cpu::sdot_serial(in, x32.data + n * x32.ld, w32.get()) + bias;
    }
    gemm_cpu::store_block_serial(y32.get(), cols, y, 0, rows, m0, cols);
  });
}

}  // namespace

void linear_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                const TensorView& b) {
  if (x.dtype == DType::f32) linear_f32(y, x, w, b);
  else {
    const int64_t gemv_rows = gemv_max_rows(w);
    plan::note("gemm", x.rows() > gemv_rows, double(x.rows()), double(gemv_rows + 1));  // Note [plan regimes]
    if (x.rows() <= gemv_rows) linear_16bit_gemv(y, x, w, b);
    else linear_16bit(y, x, w, b);
  }
}

// dx = dy @ w, dw = dy^T @ x (f32 straight into the outputs; 16-bit through f32 buffers),
// db = column sums of dy in row order.
void linear_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                         const TensorView& db, const TensorView& dy, const TensorView& x,
                         const TensorView& w) {
  const int64_t rows = x.rows(), in = x.size(-1), out = w.size(0);
  const F32Panel dy32 = gemm_cpu::f32_rows(dy, 0, rows);
  const F32Panel x32 = gemm_cpu::f32_rows(x, 0, rows);
  const F32Panel w32 = gemm_cpu::f32_rows(w, 0, out);
  const bool f32 = x.dtype == DType::f32;
  std::unique_ptr<float[]> dx_buf, dw_buf;
  float* dxp = f32 ? static_cast<float*>(dx.data) : (dx_buf.reset(new float[size_t(std::max<int64_t>(rows * in, 1))]), dx_buf.get());
  float* dwp = f32 ? static_cast<float*>(dw.data) : (dw_buf.reset(new float[size_t(std::max<int64_t>(out * in, 1))]), dw_buf.get());
  const int64_t ldx = f32 ? dx.row_stride() : in, ldw = f32 ? dw.row_stride() : in;
  gemm_cpu::sgemm(false, false, rows, in, out, dy32.data, dy32.ld, w32.data, w32.ld, 0.0f, dxp, ldx);
  gemm_cpu::sgemm(true, false, out, in, rows, dy32.data, dy32.ld, x32.data, x32.ld, 0.0f, dwp, ldw);
  if (!f32) {
    gemm_cpu::store_rows(dxp, ldx, dx, 0, in);
    gemm_cpu::store_rows(dwp, ldw, dw, 0, in);
  }
  std::unique_ptr<float[]> sums(new float[size_t(std::max<int64_t>(out, 1))]);
  gemm_cpu::column_sums(dy, sums.get());
  gemm_cpu::store_rows(sums.get(), out, db, 0, out);
}

const char* linear_cpu_applicable(const TensorView& y, const TensorView& x, const TensorView& w,
                                  const TensorView&) {
  if (const char* why = dtype_reason(x)) return why;
  return blas_reason({x.rows(), x.size(-1), w.size(0), x.row_stride(), w.row_stride(), y.row_stride()});
}

const char* linear_backward_cpu_applicable(const TensorView& dx, const TensorView& dw,
                                           const TensorView&, const TensorView& dy,
                                           const TensorView& x, const TensorView& w) {
  if (const char* why = dtype_reason(x)) return why;
  return blas_reason({x.rows(), x.size(-1), w.size(0), x.row_stride(), w.row_stride(),
                      dy.row_stride(), dx.row_stride(), dw.row_stride()});
}

}  // namespace opforge
