// Copies of whole rows by a row index: the embedding forward (y row i = w row ids[i]) and the MoE
// dispatch (permuted row r = x row token_of[r]).
#pragma once

#include <cstdint>

namespace opforge::cpu {

// Note [row gather]: dst row i (i in [begin, end)) = src row index[i], row_bytes bytes each.
// Without streaming each row is one memcpy (the library's widest loop; the rows stay in cache
// for the next op). With streaming (the caller asked cpu::stream_outputs, which checked that
// every dst row starts 64-byte aligned) whole vectors go out by non-temporal stores, so no dst
// line is read first (a plain store moves 3 bytes per 2 copied), the row's tail by memcpy; and
// while a row is copied the next one's lines are prefetched: its address comes from the next
// index, which no hardware prefetcher follows. Zen 4 VM, embedding 16,384 x 4,096 bf16 from
// 32,000 rows: 11.3-12.1 ms by memcpy, 9.5-9.9 ms so (docs/perf/cpu.md, 2026-12-03).
struct RowGather {
  char* dst = nullptr;
  int64_t dst_stride = 0;  // bytes
  const char* src = nullptr;
  int64_t src_stride = 0;  // bytes
  int64_t row_bytes = 0;
  const void* index = nullptr;  // int32 or int64 row numbers of src
  bool index_i64 = true;
};
void gather_rows(const RowGather& g, int64_t begin, int64_t end, bool stream);

}  // namespace opforge::cpu
