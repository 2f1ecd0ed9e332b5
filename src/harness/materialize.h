// Inputs from fixed seeds, and guarded, poisoned buffers (Note [poison and guards], harness.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "opforge/op.h"
#include "opforge/tensor.h"

namespace opforge::harness::detail {

// splitmix64-based generator: the same numbers on every platform and compiler.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();  // [0, 1)
  double normal();   // N(0, 1), Box-Muller
 private:
  uint64_t state_;
};
uint64_t mix_seed(uint64_t seed, std::string_view a, std::string_view b, std::string_view c);

// Master values (f64) for a TensorInit, rounded to `dtype` so that every backend and the f64
// truth see exactly the same numbers.
std::vector<double> generate(const TensorInit& init, DType dtype, Rng& rng);
// Fills a contiguous host buffer of init.shape in `dtype` for perf mode (Note [perf inputs]).
void fill_for_perf(void* host, const TensorInit& init, DType dtype, uint64_t seed);

// Bytes used for the sentinel guard on each side of a buffer.
inline constexpr int64_t kGuardBytes = 256;
inline constexpr uint8_t kSentinel = 0xA5;

// A tensor inside a larger allocation; everything but its elements is sentinel.
struct Guarded {
  Tensor storage;                 // u8 [guard + span + guard] on the device
  TensorView view;                // the elements, with the requested row padding
  std::vector<int64_t> offsets;   // element offsets (in elements, from view.data) in C order
  std::vector<uint8_t> initial;   // host image of the whole allocation as written before the call
};

// values == nullptr: elements are poisoned (a NaN with payload, or 0xA5 bytes for integers).
Guarded make_guarded(const Shape& shape, DType dtype, int64_t row_pad, Device device,
                     const std::vector<double>* values);
std::vector<uint8_t> read_back(const Guarded& g);
// "" when every byte outside the elements still holds the sentinel; else where it changed.
std::string check_outside(const Guarded& g, const std::vector<uint8_t>& after);
// Element values from a host image; `poisoned[i]` true when element i still holds the poison.
std::vector<double> element_values(const Guarded& g, const std::vector<uint8_t>& image,
                                   std::vector<bool>* poisoned);
// A plain contiguous tensor with the given values (truth and perf inputs).
Tensor make_tensor(const Shape& shape, DType dtype, Device device, const std::vector<double>& values);
std::vector<double> tensor_values(const TensorView& t);  // any device, C order

}  // namespace opforge::harness::detail
