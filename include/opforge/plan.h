// The plan a kernel chose for one call, noted for the performance database.
//
// Note [plan regimes]: some kernels switch between ways of running at a size threshold: the CPU
// kernels run a small call on the calling thread and a larger one on every thread (Note
// [balanced tasks] in backends/cpu/tiling.h), stream their outputs past the last-level cache
// (Note [streaming stores]), or take a dot-product path for a few rows of linear (Note [decode
// gemv] in ops/linear/cpu.cpp); CUDA moe_permute runs in one launch up to 4,096 (token, slot)
// pairs and sorts above (ops/routing/cuda_moe.cu). Time per byte jumps at such a switch, so a
// curve fitted through points on both sides of it predicts either side poorly. Each such decision
// is noted here, as
//     key, on (the way taken), value and threshold (on when value >= threshold, in the units the
//     kernel compared: bytes, rows),
// while the collector records a call (plan::Recording); the collector stores the notes with the
// row, and the database interpolates only among rows of the same plan (Note [plan lines] in
// src/perfdb/internal.h). Outside a recording a note costs one relaxed atomic load.
#pragma once

#include <string>
#include <vector>

namespace opforge::plan {

struct Decision {
  std::string key;
  bool on = false;
  double value = 0;
  double threshold = 0;
  bool operator==(const Decision&) const = default;
};

// Notes a decision made on this thread, when a Recording is active on it.
void note(const char* key, bool on, double value, double threshold);

// Collects the decisions noted on this thread while it lives (not nested). Distinct decisions
// only, in the order first noted; a key noted with different values or outcomes gets the
// suffixes .2, .3, ... in that order.
class Recording {
 public:
  Recording();
  ~Recording();
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  std::vector<Decision> decisions() const;
};

// "key+value/threshold;key-value/threshold" ('+' on, '-' off): the text of a perf table's plan
// column (no commas). parse() throws opforge::Error on malformed text.
std::string to_text(const std::vector<Decision>& decisions);
std::vector<Decision> parse(const std::string& text);

}  // namespace opforge::plan
