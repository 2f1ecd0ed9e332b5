#include "backends/cpu/tiling.h"

#include "opforge/plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace opforge::cpu {

int64_t capacity_block(const TileSpec& spec, int64_t cache_bytes) {
  const double budget = spec.safety_margin * double(cache_bytes);
  const double unit = double(std::max<int64_t>(spec.bytes_per_element, 1)) *
                      double(std::max<int64_t>(spec.multiplier, 1));
  const int64_t max_block = std::max<int64_t>(spec.max_block, 1);
  int64_t block = 1;
  while (block * 2 <= max_block && unit * double(block * 2) <= budget) block *= 2;
  return block;
}

int64_t capacity_block(const TileSpec& spec) {
  return capacity_block(spec, cpu_info().cache(spec.level).bytes);
}

RowTasks row_blocks(int64_t rows, const TileSpec& spec) {
  RowTasks t;
  t.rows = rows;
  t.rows_per_task = capacity_block(spec);
  t.bytes_per_row = std::max<int64_t>(spec.bytes_per_element, 1) * std::max<int64_t>(spec.multiplier, 1);
  return t;
}

RowTasks partial_chunks(RowTasks tiles) {
  const int64_t tiles_per_chunk = std::max<int64_t>(1, ceil_div(tiles.count(), kMaxPartialChunks));
  tiles.rows_per_task *= tiles_per_chunk;
  return tiles;
}

namespace {
int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
}  // namespace

int64_t min_parallel_bytes() {
  static const int64_t bytes = [] {
    const char* v = std::getenv("OPFORGE_CPU_MIN_PARALLEL_BYTES");
    const int64_t n = v != nullptr ? parse_size(v) : 0;
    return n >= 1 && n <= (int64_t(1) << 30) ? n : kMinParallelBytes;
  }();
  return bytes;
}

bool single_thread_call(double bytes) {
  const int threads = max_threads();
  if (threads <= 1) return true;
  const double threshold = double(threads) * double(min_parallel_bytes());
  plan::note("threads", bytes >= threshold, bytes, threshold);  // Note [plan regimes]
  return bytes < threshold;
}

RowTasks balanced(RowTasks tasks) {
  const int64_t n = tasks.count();
  const int threads = max_threads();
  if (n == 0 || threads <= 1) return tasks;
  const double bytes = double(tasks.rows) * double(tasks.bytes_per_row);
  const double threshold = double(threads) * double(min_parallel_bytes());
  if (tasks.rows <= 1) {  // one row: nothing to split (Note [plan regimes]: the one-thread plan)
    if (tasks.bytes_per_row > 0) plan::note("threads", false, bytes, threshold);
    return tasks;
  }
  if (n == 1 && (tasks.bytes_per_row <= 0 || single_thread_call(bytes))) return tasks;
  if (n > 1 && tasks.bytes_per_row > 0) plan::note("threads", true, bytes, threshold);  // every thread, whatever the bytes
  const int64_t want = ceil_div(n, threads) * threads;
  tasks.rows_per_task = std::max<int64_t>(1, ceil_div(tasks.rows, want));
  return tasks;
}

int64_t stream_bytes() {
  static const int64_t forced = [] {
    const char* v = std::getenv("OPFORGE_CPU_STREAM_BYTES");
    const int64_t n = v != nullptr ? parse_size(v) : 0;
    return n >= 1 ? n : 0;
  }();
  if (forced > 0) return forced;
  return std::min(cpu_info().l3.bytes, int64_t(std::max(1, max_threads())) * kStreamBytesPerThread);
}

bool stream_outputs(double bytes_moved, std::initializer_list<const TensorView*> outputs) {
  double out_bytes = 0;
  for (const TensorView* t : outputs) out_bytes += double(t->rows()) * double(t->row_stride() * t->itemsize());
  // Note [plan regimes]: the share decides in the database's terms (outputs over stream_bytes());
  // a call over the whole L3 streams whatever its outputs, noted as over the share too.
  const bool big = bytes_moved > double(cpu_info().l3.bytes) || out_bytes > double(stream_bytes());
  bool aligned = true;
  for (const TensorView* t : outputs) {
    aligned = aligned && reinterpret_cast<uintptr_t>(t->data) % 64 == 0;
    aligned = aligned && (t->row_stride() * t->itemsize()) % 64 == 0;
  }
  if (aligned) plan::note("stream", big, out_bytes, double(stream_bytes()));
  return big && aligned;
}

}  // namespace opforge::cpu
