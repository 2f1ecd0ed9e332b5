// Reading and writing numpy .npy files (the CLI's and the harness's tensor exchange format).
//
// Supported: format versions 1.0, 2.0 and 3.0, C order, little-endian, with these dtypes:
//
//   numpy descr   opforge dtype     notes
//   '<f4'         f32
//   '<f8'         f64
//   '<f2'         f16
//   '<i4'         i32
//   '<i8'         i64
//   '|u1'         u8
//   '|b1'         u8                numpy bool; read as 0 / 1 bytes (written back as '|u1')
//   '<u2'         bf16              raw bf16 bits, the form NpyBf16::raw_bits writes
//
// Note [npy bf16]: numpy has no bfloat16 dtype. write_npy stores a bf16 tensor either as '<f4'
// (NpyBf16::as_f32, the default: every bf16 value widens to f32 exactly, so numpy users see the
// true values; reading it back gives an f32 tensor), or as '<u2' holding the raw 16 bits
// (NpyBf16::raw_bits: bit-exact round trip; read_npy maps '<u2' back to bf16).
//
// Everything else — bad magic, unknown version, truncated preamble or header, a header that is
// not a Python dict literal of exactly 'descr', 'fortran_order' and 'shape', an unknown or
// big-endian dtype, fortran_order True, negative dims, dims whose product overflows int64, more
// than kMaxDims dims, data shorter or longer than the shape says — throws
// Error(ErrorCode::io) with a message naming the file and the problem. The reader never reads
// beyond its input and computes every size in 64 bits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "opforge/tensor.h"

namespace opforge {

enum class NpyBf16 : uint8_t {
  as_f32,    // '<f4', exact widening (default)
  raw_bits,  // '<u2', the bf16 bit patterns
};

// A CPU tensor, contiguous, with the file's dtype and shape (0-d files give a 0-d tensor).
Tensor read_npy(const std::string& path);
// The same from bytes in memory; `name` stands for the file in error messages.
Tensor read_npy_bytes(std::span<const uint8_t> bytes, const std::string& name = "<memory>");

// Writes any defined view (strided or on another device: copied to a contiguous host buffer
// first). The header is version 1.0 unless it needs more than 65535 bytes (then 2.0).
void write_npy(const std::string& path, const TensorView& t, NpyBf16 rule = NpyBf16::as_f32);
std::vector<uint8_t> write_npy_bytes(const TensorView& t, NpyBf16 rule = NpyBf16::as_f32);

}  // namespace opforge
