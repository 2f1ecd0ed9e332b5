// f32 GEMM and panels of the linear family (ops/linear/internal.h).
#include "ops/linear/internal.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "backends/cpu/cpu_info.h"
#include "backends/cpu/convert.h"
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge::gemm_cpu {

namespace {

// Rows per conversion task: Note [tiling] over L2 with the f32 and the source row in the set.
cpu::RowTasks row_tasks(int64_t rows, int64_t cols) {
  cpu::TileSpec spec;
  spec.bytes_per_element = 4 + 2;
  spec.multiplier = std::max<int64_t>(cols, 1);
  spec.level = cpu::CacheLevel::l2;
  return {rows, cpu::capacity_block(spec)};
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  // Note [one thread pool]: OpenBLAS runs single-threaded; OpenMP splits C into one block of rows
  // or columns per thread (the longer side), each a whole-k product, so no sum is split.
  const int64_t threads = std::max(1, cpu::cpu_info().threads);
  const bool split_n = n >= m;
  const cpu::RowTasks blocks{split_n ? n : m, cpu::ceil_div(split_n ? n : m, threads)};
  cpu::parallel_tasks(blocks.count(), [&](int64_t t) {
    const int64_t lo = blocks.begin(t), len = blocks.end(t) - lo;
    const float* at = a;
    const float* bt = b;
    float* ct = c;
    if (split_n) {
      bt = trans_b ? b + lo * ldb : b + lo;
      ct = c + lo;
    } else {
      at = trans_a ? a + lo : a + lo * lda;
      ct = c + lo * ldc;
    }
    sgemm_serial(trans_a, trans_b, split_n ? m : len, split_n ? len : n, k, at, lda, bt, ldb, beta,
                 ct, ldc);
  });
}

float sdot_serial(int64_t n, const float* a, const float* b) {
  if (n <= 0) return 0.0f;
  static std::once_flag serial_blas;  // Note [one thread pool]
  std::call_once(serial_blas, [] { openblas_set_num_threads(1); });
  return cblas_sdot(blasint(n), a, 1, b, 1);
}

void sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  static std::once_flag serial_blas;  // Note [one thread pool]
  std::call_once(serial_blas, [] { openblas_set_num_threads(1); });
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), 1.0f, a, blasint(std::max<int64_t>(lda, 1)), b,
              blasint(std::max<int64_t>(ldb, 1)), beta, c, blasint(std::max<int64_t>(ldc, 1)));
}

void widen_block_serial(const TensorView& t, int64_t row_begin, int64_t row_end, int64_t col_begin,
                        int64_t cols, float* dst) {
  const int64_t stride = t.row_stride();
  for (int64_t row = row_begin; row < row_end; ++row) {
    float* out = dst + (row - row_begin) * cols;
    const int64_t at = row * stride + col_begin;
    switch (t.dtype) {
      case DType::bf16: cpu::bf16_to_f32_n(static_cast<const uint16_t*>(t.data) + at, out, cols); break;
      case DType::f16: cpu::f16_to_f32_n(static_cast<const uint16_t*>(t.data) + at, out, cols); break;
      default: std::memcpy(out, static_cast<const float*>(t.data) + at, size_t(cols) * 4);
    }
  }
}

void store_block_serial(const float* src, int64_t ld, const TensorView& dst, int64_t row_begin,
                        int64_t row_end, int64_t col_begin, int64_t cols) {
  const int64_t stride = dst.row_stride();
  for (int64_t row = row_begin; row < row_end; ++row) {
    const float* in = src + (row - row_begin) * ld;
    const int64_t at = row * stride + col_begin;
    switch (dst.dtype) {
      case DType::bf16: cpu::f32_to_bf16_n(in, static_cast<uint16_t*>(dst.data) + at, cols); break;
      case DType::f16: cpu::f32_to_f16_n(in, static_cast<uint16_t*>(dst.data) + at, cols); break;
      default: std::memcpy(static_cast<float*>(dst.data) + at, in, size_t(cols) * 4);
    }
  }
}

void widen_rows(const TensorView& t, int64_t row_begin, int64_t row_end, float* dst) {
  const int64_t cols = t.size(-1);
  const cpu::RowTasks tasks = row_tasks(row_end - row_begin, cols);
  cpu::parallel_tasks(tasks.count(), [&](int64_t task) {
    widen_block_serial(t, row_begin + tasks.begin(task), row_begin + tasks.end(task), 0, cols,
                       dst + tasks.begin(task) * cols);
  });
}

F32Panel f32_rows(const TensorView& t, int64_t row_begin, int64_t row_end) {
  F32Panel p;
  const int64_t cols = t.size(-1);
  if (t.dtype == DType::f32) {
    p.data = static_cast<const float*>(t.data) + row_begin * t.row_stride();
    p.ld = t.row_stride();
    return p;
  }
  p.owned.reset(new float[size_t(std::max<int64_t>((row_end - row_begin) * cols, 1))]);
  widen_rows(t, row_begin, row_end, p.owned.get());
  p.data = p.owned.get();
  p.ld = cols;
  return p;
}

void store_rows(const float* src, int64_t ld, const TensorView& dst, int64_t col_begin,
                int64_t cols) {
  const cpu::RowTasks tasks = row_tasks(dst.rows(), cols);
  cpu::parallel_tasks(tasks.count(), [&](int64_t task) {
    store_block_serial(src + tasks.begin(task) * ld, ld, dst, tasks.begin(task), tasks.end(task),
                       col_begin, cols);
  });
}

void column_sums(const TensorView& t, float* out) {
  const int64_t rows = t.rows(), cols = t.size(-1), stride = t.row_stride();
  // Columns per task: Note [tiling] over L1 for the f32 sums and one row segment.
  cpu::TileSpec spec;
  spec.bytes_per_element = 4 + t.itemsize();
  spec.level = cpu::CacheLevel::l1d;
  const cpu::RowTasks blocks{cols, cpu::capacity_block(spec)};
  cpu::parallel_tasks(blocks.count(), [&](int64_t task) {
    const int64_t c0 = blocks.begin(task), c1 = blocks.end(task), n = c1 - c0;
    float* acc = out + c0;
    std::fill(acc, acc + n, 0.0f);
    std::unique_ptr<float[]> row32(new float[size_t(n)]);
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t at = row * stride + c0;
      const float* r = row32.get();
      switch (t.dtype) {
        case DType::bf16: cpu::bf16_to_f32_n(static_cast<const uint16_t*>(t.data) + at, row32.get(), n); break;
        case DType::f16: cpu::f16_to_f32_n(static_cast<const uint16_t*>(t.data) + at, row32.get(), n); break;
        default: r = static_cast<const float*>(t.data) + at;
      }
      for (int64_t j = 0; j < n; ++j) acc[j] += r[j];
    }
  });
}

Scratch::Scratch(ScratchMeter& meter, int64_t floats)
    : meter_(&meter), bytes_(std::max<int64_t>(floats, 0) * 4),
      data_(floats > 0 ? new float[size_t(floats)] : nullptr) {
  meter_->add(bytes_);
}
Scratch::~Scratch() { meter_->sub(bytes_); }

}  // namespace opforge::gemm_cpu
