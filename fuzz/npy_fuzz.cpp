// Fuzz target: opforge::read_npy_bytes. Anything it accepts must write back (write_npy_bytes) and
// read again to the same dtype, shape and bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>

#include "opforge/error.h"
#include "opforge/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  opforge::Tensor t;
  try {
    t = opforge::read_npy_bytes(std::span<const uint8_t>(data, size), "fuzz.npy");
  } catch (const opforge::Error&) {
    return 0;
  }
  // bf16 arrives only as raw '<u2' bits; write it back the same way for a bit-exact round trip.
  const auto bytes = opforge::write_npy_bytes(t, opforge::NpyBf16::raw_bits);
  const opforge::Tensor again = opforge::read_npy_bytes(bytes, "round trip");
  const bool same = again.dtype() == t.dtype() && again.shape() == t.shape() &&
                    (t.nbytes() == 0 || std::memcmp(again.data(), t.data(), size_t(t.nbytes())) == 0);
  if (!same) {
    std::fprintf(stderr, "round trip differs: %s vs %s\n", t.view().str().c_str(),
                 again.view().str().c_str());
    __builtin_trap();
  }
  return 0;
}
