// Block sizes for CPU kernels, from the cache sizes of the machine (Note [cache sizes]).
//
// Note [tiling]: every CPU kernel takes its block sizes (rows per OpenMP task, elements per task)
// from capacity_block(), never from constants of its own:
//
//   block = the largest power of two with
//           bytes_per_element * multiplier * block <= safety_margin * cache_bytes(level)
//
// bytes_per_element is the working set one element brings (the bytes of every tensor the kernel
// touches at that element, plus any scratch it keeps per element); multiplier is the number of
// elements in one unit of the block (hidden for a block of rows, 1 for a block of elements).
// safety_margin leaves room for what the block does not account for (other tensors' lines,
// hardware prefetch, the cache's associativity). The block is at least 1 (a unit too large for
// the cache still runs, one unit at a time) and at most max_block. A power of two keeps blocks
// aligned to vector widths and makes the sizes easy to read in traces.
//
// Block sizes depend on the machine's caches, never on the thread count, so results of kernels
// that reduce per block (dw of the norm backward ops) are the same run to run on one machine.
#pragma once

#include <algorithm>
#include <cstdint>

#include <initializer_list>

#include "backends/cpu/cpu_info.h"
#include "opforge/tensor.h"

namespace opforge::cpu {

struct TileSpec {
  int64_t bytes_per_element = 4;
  int64_t multiplier = 1;
  CacheLevel level = CacheLevel::l2;
  double safety_margin = 0.5;
  int64_t max_block = int64_t(1) << 30;
};

// Note [tiling] with the cache size of this machine (cpu_info()).
int64_t capacity_block(const TileSpec& spec);
// The same with an explicit cache size (tests, what-if estimates).
int64_t capacity_block(const TileSpec& spec, int64_t cache_bytes);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows cut into tasks of rows_per_task rows (the last one may be shorter). bytes_per_row, when
// known (row_blocks), lets balanced() decide whether a one-block call is worth a second thread.
struct RowTasks {
  int64_t rows = 0;
  int64_t rows_per_task = 1;
  int64_t bytes_per_row = 0;

  int64_t count() const { return rows > 0 ? ceil_div(rows, rows_per_task) : 0; }
  int64_t begin(int64_t task) const { return task * rows_per_task; }
  int64_t end(int64_t task) const { return std::min(rows, (task + 1) * rows_per_task); }
};

// Blocks of `rows` rows of spec.multiplier elements each: Note [tiling], with the row's bytes
// (spec.bytes_per_element x spec.multiplier) kept for balanced().
RowTasks row_blocks(int64_t rows, const TileSpec& spec);

// Note [balanced tasks]: a kernel whose every output row depends only on its own input rows (the
// forward norms, rotary, softmax, routing, permutes) may cut its rows into a multiple of the
// thread count of tasks, each at most the capacity block (Note [tiling]), so that the static
// schedule gives every thread the same number of rows. With blocks alone, 3 blocks on 2 threads
// run as 2 rounds, the second on one thread: rms_norm at hidden 2048 took 44.8 us at 192 tokens
// and 21.2 us at 128. A call that fits one block is cut the same way once it moves at least
// min_parallel_bytes() a thread (kMinParallelBytes; bytes_per_row must be known): one thread
// working through a whole block left the other idle (rms_norm at hidden 4096: 19.0 us at 32
// tokens on one thread, 16.4 us at 48 on two), a step in time against tokens that the perf
// database's interpolation cannot follow. Below that a call stays one task on the calling thread
// (no OpenMP region), where waking a thread costs about what it saves. Kernels that reduce per
// task (dw of the norm backward ops) keep the plain blocks, whose results must not depend on the
// thread count.
RowTasks balanced(RowTasks tasks);

// Note [bounded partials]: a backward kernel that sums a parameter gradient over rows gives each
// chunk of rows one f32 partial row and adds the partials in chunk order (deterministic: the
// chunks depend on the shape and the cache sizes, never on the thread count). Chunks of one tile
// (Note [tiling]) made the partials grow with the rows: at 16,384 x 4,096, 8-row tiles gave 2,048
// partial rows (32 MB of f32, as much as two inputs in bf16), allocated, faulted in and read back
// on every call. partial_chunks() joins whole tiles into at most kMaxPartialChunks chunks, each
// still processed one row at a time in order, so the partials stay within kMaxPartialChunks rows
// and the order of the sums stays fixed.
inline constexpr int64_t kMaxPartialChunks = 128;
RowTasks partial_chunks(RowTasks tiles);

// Bytes a thread must move before a call is spread over threads (Note [balanced tasks]): measured
// on the 2-core Xeon machine (docs/perf/cpu.md); tuning runs override it with
// OPFORGE_CPU_MIN_PARALLEL_BYTES (bytes, 1 .. 2^30, "32K" style accepted).
inline constexpr int64_t kMinParallelBytes = int64_t(32) << 10;
int64_t min_parallel_bytes();
// True when a call moving `bytes` in all should run on the calling thread alone: one thread, or
// fewer than min_parallel_bytes() per thread.
bool single_thread_call(double bytes);

// Note [streaming stores]: a kernel writes its outputs by non-temporal stores when they would not
// stay in cache for the next op anyway: the call moves more bytes than the last-level cache holds,
// or its outputs alone exceed the part of that cache the process can count on, stream_bytes(): the
// L3 the machine reports, at most kStreamBytesPerThread for each thread the process runs. Every
// output row must also start on a 64-byte boundary (so every pair step of every target is
// aligned). The cap matters on virtual machines, which report the host's whole L3 (480 MiB on the
// 2-core Xeon VM) while other tenants share it: without it a 16,384 x 4,096 bf16 rms_norm there
// (256 MB moved) wrote its 128 MB with read-for-ownership, a third more traffic than the streaming
// memcpy of the copy ceiling; with it the norms at that size run 1.16-1.27x faster (docs/perf/
// cpu.md). 32 MiB a thread because smaller outputs did stay in that L3 there (a 59 MB
// silu_and_mul_backward output lost 35% when streamed). The norm family and layer_norm use this
// rule; the activations stream only past the whole L3 (ops/activation/cpu.cpp: bound by their
// arithmetic, streaming did not help them). OPFORGE_CPU_STREAM_BYTES (bytes, "64M" style)
// overrides the share.
inline constexpr int64_t kStreamBytesPerThread = int64_t(32) << 20;

// Note [line blocks]: a row-pair pass (Note [row pairs] in ops/layernorm/cpu.cpp) that streams its
// outputs lets the rows take turns by blocks of kLineBlock columns (whole 64-byte lines of every
// output, 512 bytes in bf16) rather than a vector or pair step at a time, so each row's
// non-temporal stores fill their lines one after another instead of two or four rows' lines being
// filled in turn. The values and the order of every sum stay those of the pair pass (the f32
// partials are added row after row per column either way; a block starts on a pair step). On the
// 2-core Zen 3 VM (AVX2), 16,384 x 4,096 bf16, the alternating stores ran at 1.6-2.1 GB/s for
// layer_norm_backward, 4.2-4.7 for rms_norm_backward and 3.9-4.2 for fused_add_rms_norm_backward;
// by blocks 7.6-8.2, 14.0-15.9 and 8.4-8.6 (docs/perf/cpu.md).
inline constexpr int64_t kLineBlock = 256;
int64_t stream_bytes();
bool stream_outputs(double bytes_moved, std::initializer_list<const TensorView*> outputs);

}  // namespace opforge::cpu
