// .npy reading and writing (see include/opforge/npy.h for the format rules and Note [npy bf16]).
//
// Layout of a file: 6 bytes magic "\x93NUMPY", 1 byte major, 1 byte minor version, the header
// length (uint16 LE for 1.0, uint32 LE for 2.0 / 3.0), the header (a Python dict literal padded
// with spaces and ending in '\n'), then the raw C-order data.
#include <algorithm>
#include "opforge/npy.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>

#include "opforge/error.h"

namespace opforge {

static_assert(std::endian::native == std::endian::little,
              "opforge's npy I/O assumes a little-endian host");

namespace {

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr int64_t kPreambleV1 = 10;  // magic + version + uint16 length
constexpr int64_t kPreambleV2 = 12;  // magic + version + uint32 length

[[noreturn]] void fail(const std::string& name, const std::string& problem) {
  throw Error(ErrorCode::io, "npy file '" + name + "': " + problem);
}

struct DescrEntry {
  const char* descr;
  DType dtype;
};
constexpr DescrEntry kDescrs[] = {{"<f4", DType::f32}, {"<f8", DType::f64}, {"<f2", DType::f16},
                                  {"<i4", DType::i32}, {"<i8", DType::i64}, {"|u1", DType::u8},
                                  {"|b1", DType::u8},  {"<u2", DType::bf16},
                                  {"|V1", DType::f8e4m3}};

DType dtype_from_descr(const std::string& descr, const std::string& name) {
  for (const DescrEntry& e : kDescrs)
    if (descr == e.descr) return e.dtype;
  if (!descr.empty() && descr[0] == '>') {
    std::string little = descr;
    little[0] = '<';
    for (const DescrEntry& e : kDescrs)
      if (little == e.descr) fail(name, "big-endian dtype '" + descr + "' is not supported");
  }
  fail(name, "unsupported dtype '" + descr +
                 "' (supported: <f4 <f8 <f2 <i4 <i8 |u1 |b1 <u2 as bf16 bits, |V1 as f8e4m3 bits)");
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::f16: return "<f2";
    case DType::bf16: return "<u2";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::u8: return "|u1";
    case DType::f8e4m3: return "|V1";  // raw e4m3 bytes, as numpy writes ml_dtypes' float8_e4m3fn
  }
  return "?";
}

// ---- preamble ------------------------------------------------------------------------------
struct Preamble {
  int64_t header_start = 0;
  int64_t header_len = 0;
};

// `bytes` holds at least the first min(total, 12) bytes of the file; `total` is the file size.
Preamble parse_preamble(std::span<const uint8_t> bytes, int64_t total, const std::string& name) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 6) != 0) {
    if (bytes.size() >= 6 && std::memcmp(bytes.data(), kMagic, 6) == 0)
      fail(name, "truncated preamble (" + std::to_string(bytes.size()) + " bytes)");
    fail(name, "bad magic: not a .npy file");
  }
  const int major = bytes[6], minor = bytes[7];
  if (minor != 0 || major < 1 || major > 3)
    fail(name, "unsupported format version " + std::to_string(major) + "." + std::to_string(minor));
  Preamble p;
  p.header_start = major == 1 ? kPreambleV1 : kPreambleV2;
  if (int64_t(bytes.size()) < p.header_start)
    fail(name, "truncated preamble (" + std::to_string(bytes.size()) + " bytes)");
  if (major == 1) {
    p.header_len = int64_t(bytes[8]) | int64_t(bytes[9]) << 8;
  } else {
    p.header_len = int64_t(bytes[8]) | int64_t(bytes[9]) << 8 | int64_t(bytes[10]) << 16 |
                   int64_t(bytes[11]) << 24;
  }
  if (p.header_len > total - p.header_start)
    fail(name, "truncated header: it claims " + std::to_string(p.header_len) + " bytes, the file has " +
                   std::to_string(total - p.header_start) + " after the preamble");
  return p;
}

// ---- the header dict -------------------------------------------------------------------------
struct HeaderFields {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
};

// A parser for the one Python literal numpy writes: {'key': value, ...} with values a string,
// True / False, or a tuple of non-negative ints. Every access is bounds-checked.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  HeaderFields parse() {
    HeaderFields f;
    skip_ws();
    expect('{', "the header does not start with '{'");
    skip_ws();
    while (!eat('}')) {
      std::string key = parse_string("a key");
      skip_ws();
      expect(':', "expected ':' after key '" + key + "'");
      skip_ws();
      parse_field(key, f);
      skip_ws();
      if (eat(',')) { skip_ws(); continue; }
      skip_ws();
      expect('}', "expected ',' or '}' after the value of '" + key + "'");
      break;
    }
    skip_ws();
    if (pos_ != text_.size()) garbage("unexpected text after the dict");
    return f;
  }

 private:
  [[noreturn]] void garbage(const std::string& what) const {
    fail(name_, "malformed header at byte " + std::to_string(pos_) + ": " + what);
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  void skip_ws() {
    while (!at_end() && (peek() == ' ' || peek() == '\n' || peek() == '\t' || peek() == '\r')) ++pos_;
  }
  bool eat(char c) {
    if (at_end() || peek() != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c, const std::string& what) {
    if (!eat(c)) garbage(what);
  }
  bool eat_word(std::string_view w) {
    if (text_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  std::string parse_string(const char* what) {
    char quote = peek();
    if (quote != '\'' && quote != '"') garbage(std::string("expected a quoted string as ") + what);
    ++pos_;
    std::string out;
    while (!at_end() && peek() != quote) {
      if (peek() == '\\') ++pos_;  // the escaped character is taken as is
      if (at_end()) break;
      out += text_[pos_++];
    }
    if (!eat(quote)) garbage("unterminated string");
    return out;
  }

  void parse_field(const std::string& key, HeaderFields& f) {
    if (key == "descr") {
      if (f.descr) garbage("duplicate key 'descr'");
      if (peek() != '\'' && peek() != '"')
        fail(name_, "descr is not a simple dtype string (structured dtypes are not supported)");
      f.descr = parse_string("descr");
    } else if (key == "fortran_order") {
      if (f.fortran_order) garbage("duplicate key 'fortran_order'");
      if (eat_word("True")) f.fortran_order = true;
      else if (eat_word("False")) f.fortran_order = false;
      else garbage("fortran_order is not True or False");
    } else if (key == "shape") {
      if (f.shape) garbage("duplicate key 'shape'");
      f.shape = parse_shape();
    } else {
      garbage("unexpected key '" + key + "'");
    }
  }

  std::vector<int64_t> parse_shape() {
    expect('(', "shape is not a tuple");
    std::vector<int64_t> dims;
    skip_ws();
    while (!eat(')')) {
      if (dims.size() == size_t(kMaxDims))
        fail(name_, "shape has more than " + std::to_string(kMaxDims) + " dims");
      dims.push_back(parse_dim());
      skip_ws();
      if (eat(',')) { skip_ws(); continue; }
      expect(')', "expected ',' or ')' in shape");
      break;
    }
    return dims;
  }

  int64_t parse_dim() {
    if (peek() == '-') fail(name_, "negative dimension in shape");
    if (peek() < '0' || peek() > '9') garbage("expected a dimension (a non-negative integer)");
    int64_t v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      int digit = peek() - '0';
      if (__builtin_mul_overflow(v, int64_t(10), &v) || __builtin_add_overflow(v, int64_t(digit), &v))
        fail(name_, "dimension overflows int64");
      ++pos_;
    }
    eat('L');  // shapes written by Python 2 look like (3L, 4L)
    return v;
  }

  std::string_view text_;
  const std::string& name_;
  size_t pos_ = 0;
};

// What the header says, validated: dtype, dims and the exact byte count of the data.
struct Layout {
  DType dtype = DType::f32;
  std::vector<int64_t> dims;
  int64_t data_bytes = 0;
};

Layout parse_header(std::string_view text, const std::string& name) {
  HeaderFields f = HeaderParser(text, name).parse();
  if (!f.descr) fail(name, "header has no 'descr'");
  if (!f.fortran_order) fail(name, "header has no 'fortran_order'");
  if (!f.shape) fail(name, "header has no 'shape'");
  if (*f.fortran_order) fail(name, "fortran_order True is not supported (C order only)");
  Layout l;
  l.dtype = dtype_from_descr(*f.descr, name);
  l.dims = std::move(*f.shape);
  int64_t n = 1, extent = 1;  // extent counts zero dims as 1 (Note [shape bound], tensor.cpp)
  for (int64_t d : l.dims) {
    if (__builtin_mul_overflow(n, d, &n) || __builtin_mul_overflow(extent, std::max<int64_t>(d, 1), &extent))
      fail(name, "the product of the dims overflows int64");
  }
  if (__builtin_mul_overflow(n, dtype_size(l.dtype), &l.data_bytes))
    fail(name, "the data size in bytes overflows int64");
  return l;
}

void check_data_size(const Layout& l, int64_t available, const std::string& name) {
  if (available != l.data_bytes)
    fail(name, "data size mismatch: the shape needs " + std::to_string(l.data_bytes) +
                   " bytes, the file has " + std::to_string(available));
}

// ---- writing ---------------------------------------------------------------------------------
std::string make_header(const char* descr, const TensorView& t) {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < t.ndim; ++i) dict += (i ? ", " : "") + std::to_string(t.shape[size_t(i)]);
  dict += t.ndim == 1 ? ",), }" : "), }";  // "(2, 3)", "(4,)", "()"
  // Pad with spaces so that preamble + header is a multiple of 64, ending in '\n'.
  int64_t preamble = int64_t(dict.size()) + 1 + kPreambleV1 > 65535 ? kPreambleV2 : kPreambleV1;
  int64_t total = preamble + int64_t(dict.size()) + 1;
  dict.append(size_t((64 - total % 64) % 64), ' ');
  dict += '\n';
  std::string out(kMagic, 6);
  out += char(preamble == kPreambleV1 ? 1 : 2);
  out += char(0);
  uint64_t len = dict.size();
  for (int64_t i = 0; i < preamble - 8; ++i) out += char((len >> (8 * i)) & 0xff);
  return out + dict;
}

// The bytes to write after the header, with the tensor that owns them when a copy was needed.
struct Payload {
  std::string header;
  Tensor holder;
  const void* data = nullptr;
  int64_t bytes = 0;
};

Payload prepare(const TensorView& t, NpyBf16 rule) {
  if (!t.defined()) throw Error(ErrorCode::invalid_argument, "write_npy: the tensor is none");
  Payload p;
  if (t.dtype == DType::bf16 && rule == NpyBf16::as_f32) {
    Tensor bits = Tensor::copy_of(t, Device::cpu(), DType::bf16);
    p.holder = Tensor::empty(t.shape_of(), DType::f32);
    const uint16_t* src = bits.ptr<uint16_t>();
    uint32_t* dst = p.holder.ptr<uint32_t>();
    for (int64_t i = 0; i < bits.numel(); ++i) dst[i] = uint32_t(src[i]) << 16;  // exact widening
  } else if (!t.device.is_cpu() || !t.is_contiguous()) {
    p.holder = Tensor::copy_of(t, Device::cpu(), t.dtype);
  }
  const TensorView& v = p.holder.defined() ? p.holder.view() : t;
  p.header = make_header(descr_of(v.dtype), v);
  p.data = v.data;
  p.bytes = v.numel() * v.itemsize();
  return p;
}

}  // namespace

// ---- public API ------------------------------------------------------------------------------
Tensor read_npy_bytes(std::span<const uint8_t> bytes, const std::string& name) {
  const int64_t total = int64_t(bytes.size());
  Preamble pre = parse_preamble(bytes.first(std::min<size_t>(bytes.size(), kPreambleV2)), total, name);
  std::string_view header(reinterpret_cast<const char*>(bytes.data()) + pre.header_start,
                          size_t(pre.header_len));
  Layout l = parse_header(header, name);
  const int64_t data_start = pre.header_start + pre.header_len;
  check_data_size(l, total - data_start, name);
  Tensor t = Tensor::empty(Shape(std::span<const int64_t>(l.dims)), l.dtype);
  if (l.data_bytes > 0) std::memcpy(t.data(), bytes.data() + data_start, size_t(l.data_bytes));
  return t;
}

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(path, "cannot open for reading");
  const int64_t total = int64_t(in.tellg());
  if (total < 0) fail(path, "cannot determine the file size");
  in.seekg(0);
  std::vector<uint8_t> head(size_t(std::min<int64_t>(total, kPreambleV2)));
  if (!in.read(reinterpret_cast<char*>(head.data()), std::streamsize(head.size())))
    fail(path, "read error in the preamble");
  Preamble pre = parse_preamble(head, total, path);
  std::string header(size_t(pre.header_len), '\0');
  in.seekg(pre.header_start);
  if (!in.read(header.data(), std::streamsize(header.size()))) fail(path, "read error in the header");
  Layout l = parse_header(header, path);
  check_data_size(l, total - pre.header_start - pre.header_len, path);
  Tensor t = Tensor::empty(Shape(std::span<const int64_t>(l.dims)), l.dtype);
  if (l.data_bytes > 0 && !in.read(static_cast<char*>(t.data()), std::streamsize(l.data_bytes)))
    fail(path, "read error in the data");
  return t;
}

std::vector<uint8_t> write_npy_bytes(const TensorView& t, NpyBf16 rule) {
  Payload p = prepare(t, rule);
  std::vector<uint8_t> out(p.header.begin(), p.header.end());
  const uint8_t* data = static_cast<const uint8_t*>(p.data);
  if (p.bytes > 0) out.insert(out.end(), data, data + p.bytes);
  return out;
}

void write_npy(const std::string& path, const TensorView& t, NpyBf16 rule) {
  Payload p = prepare(t, rule);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, "cannot open for writing");
  out.write(p.header.data(), std::streamsize(p.header.size()));
  if (p.bytes > 0) out.write(static_cast<const char*>(p.data), std::streamsize(p.bytes));
  out.flush();
  if (!out) fail(path, "write error");
}

}  // namespace opforge
