#include "harness/materialize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "opforge/error.h"

namespace opforge::harness::detail {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return double(next() >> 11) * 0x1p-53; }

double Rng::normal() {
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t mix_seed(uint64_t seed, std::string_view a, std::string_view b, std::string_view c) {
  uint64_t h = seed ^ 0xcbf29ce484222325ull;
  for (std::string_view s : {a, b, c}) {
    for (char ch : s) h = (h ^ uint8_t(ch)) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;
  }
  return h;
}

static double round_to(double v, DType t) {
  switch (t) {
    case DType::f32: return double(float(v));
    case DType::f16: return f16_to_f32(f32_to_f16(float(v)));
    case DType::bf16: return bf16_to_f32(f32_to_bf16(float(v)));
    case DType::f64: return v;
    case DType::f8e4m3: return f8e4m3_to_f32(f32_to_f8e4m3(float(v)));
    default: return std::trunc(v);
  }
}

// One element of a tensor: the fill rule of `init` for element `i`, scaled and rounded to `dtype`.
static double draw(const TensorInit& init, DType dtype, Rng& rng, size_t i) {
  double x = 0;
  switch (init.fill) {
    case Fill::normal_outliers: {
      x = rng.normal();
      if (rng.uniform() < 0.01) x *= 8.0 + 24.0 * rng.uniform();  // outliers, as in activations
      break;
    }
    case Fill::uniform_positive: x = 0.5 + rng.uniform(); break;
    case Fill::normal: x = rng.normal(); break;
    case Fill::zeros: x = 0; break;
    case Fill::uniform: x = init.low + (init.high - init.low) * rng.uniform(); break;
    case Fill::integers: {
      double span = std::max(init.high - init.low, 1.0);
      x = init.low + std::min(std::floor(span * rng.uniform()), span - 1);
      break;
    }
    case Fill::values: x = init.values[i % init.values.size()]; break;
  }
  return round_to(x * init.scale, dtype);
}

static void check_values(const TensorInit& init) {
  if (init.fill == Fill::values && init.values.empty() && init.shape.numel() > 0)
    throw Error(ErrorCode::invalid_argument, "harness: Fill::values with an empty list");
}

std::vector<double> generate(const TensorInit& init, DType dtype, Rng& rng) {
  check_values(init);
  std::vector<double> v(size_t(init.shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = draw(init, dtype, rng, i);
  return v;
}

// Note [perf inputs]: perf mode needs the distribution of a case's inputs, not the exact numbers
// test mode compares, so it fills each tensor in blocks of kPerfBlock elements, each block with
// its own generator seeded from (seed, block), in parallel and straight into the dtype. A model
// -sized GEMM operand (10^8-10^9 elements) then takes a fraction of a second instead of the
// minutes a sequential f64 master takes; the values are reproducible for a given seed.
void fill_for_perf(void* host, const TensorInit& init, DType dtype, uint64_t seed) {
  check_values(init);
  constexpr int64_t kPerfBlock = int64_t(1) << 16;
  const int64_t n = init.shape.numel(), blocks = (n + kPerfBlock - 1) / kPerfBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    Rng rng(seed ^ (uint64_t(b + 1) * 0xd1b54a32d192ed03ull));
    const int64_t end = std::min(n, (b + 1) * kPerfBlock);
    for (int64_t i = b * kPerfBlock; i < end; ++i) store_from_double(host, dtype, i, draw(init, dtype, rng, size_t(i)));
  }
}

// ---- guarded buffers -------------------------------------------------------------------------
static void poison_element(uint8_t* p, DType t) {
  switch (t) {
    case DType::f32: { uint32_t b = 0x7fe5a5a5u; std::memcpy(p, &b, 4); return; }
    case DType::f64: { uint64_t b = 0x7ffda5a5a5a5a5a5ull; std::memcpy(p, &b, 8); return; }
    case DType::f16: { uint16_t b = 0x7e5au; std::memcpy(p, &b, 2); return; }
    case DType::bf16: { uint16_t b = 0x7fe5u; std::memcpy(p, &b, 2); return; }
    case DType::f8e4m3: *p = 0x7fu; return;  // the e4m3 NaN (Note [fp8 e4m3])
    default: std::memset(p, kSentinel, size_t(dtype_size(t))); return;
  }
}

static std::vector<int64_t> c_order_offsets(const TensorView& v) {
  std::vector<int64_t> offs;
  int64_t n = v.numel();
  offs.reserve(size_t(n));
  std::vector<int64_t> idx(size_t(std::max(v.ndim, 1)), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    offs.push_back(off);
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < v.shape[size_t(d)]) { off += v.strides[size_t(d)]; break; }
      off -= (v.shape[size_t(d)] - 1) * v.strides[size_t(d)];
      idx[size_t(d)] = 0;
    }
  }
  return offs;
}

Guarded make_guarded(const Shape& shape, DType dtype, int64_t row_pad, Device device,
                     const std::vector<double>* values) {
  Guarded g;
  std::array<int64_t, kMaxDims> strides{};
  int64_t stride = 1;
  for (int i = shape.ndim - 1; i >= 0; --i) {
    strides[size_t(i)] = stride;
    int64_t extent = std::max<int64_t>(shape[i], 1);
    stride *= (i == shape.ndim - 1) ? extent + row_pad : extent;
  }
  int64_t span_elems = shape.numel() == 0 ? 0 : stride;
  int64_t item = dtype_size(dtype);
  int64_t total = kGuardBytes * 2 + span_elems * item;
  std::vector<uint8_t> image(size_t(total), kSentinel);
  TensorView host_view(image.data() + kGuardBytes, dtype, shape,
                       std::span<const int64_t>(strides.data(), size_t(shape.ndim)));
  g.offsets = c_order_offsets(host_view);
  for (size_t i = 0; i < g.offsets.size(); ++i) {
    if (values) store_from_double(host_view.data, dtype, g.offsets[i], (*values)[i]);
    else poison_element(static_cast<uint8_t*>(host_view.data) + g.offsets[i] * item, dtype);
  }
  g.storage = Tensor::empty(Shape{total}, DType::u8, device);
  copy_bytes(g.storage.data(), device, image.data(), Device::cpu(), total);
  g.view = TensorView(static_cast<uint8_t*>(g.storage.data()) + kGuardBytes, dtype, shape,
                      std::span<const int64_t>(strides.data(), size_t(shape.ndim)), device);
  g.initial = std::move(image);
  return g;
}

std::vector<uint8_t> read_back(const Guarded& g) {
  std::vector<uint8_t> image(g.initial.size());
  copy_bytes(image.data(), Device::cpu(), g.storage.data(), g.storage.device(), int64_t(image.size()));
  return image;
}

std::string check_outside(const Guarded& g, const std::vector<uint8_t>& after) {
  int64_t item = g.view.itemsize();
  std::vector<bool> inside(after.size(), false);
  for (int64_t off : g.offsets)
    for (int64_t b = 0; b < item; ++b) inside[size_t(kGuardBytes + off * item + b)] = true;
  for (size_t i = 0; i < after.size(); ++i) {
    if (inside[i] || after[i] == kSentinel) continue;
    int64_t rel = int64_t(i) - kGuardBytes;
    std::string where = rel < 0 ? std::to_string(-rel) + " bytes before the first element"
                        : size_t(i) >= after.size() - size_t(kGuardBytes)
                            ? std::to_string(int64_t(i) - int64_t(after.size()) + kGuardBytes + 1) +
                                  " bytes past the end"
                            : "in the padding between rows at byte " + std::to_string(rel);
    return "out-of-bounds write: guard byte changed " + where;
  }
  return "";
}

std::vector<double> element_values(const Guarded& g, const std::vector<uint8_t>& image,
                                   std::vector<bool>* poisoned) {
  int64_t item = g.view.itemsize();
  std::vector<double> v(g.offsets.size());
  uint8_t poison[8];
  poison_element(poison, g.view.dtype);
  if (poisoned) poisoned->assign(g.offsets.size(), false);
  const uint8_t* base = image.data() + kGuardBytes;
  for (size_t i = 0; i < g.offsets.size(); ++i) {
    const uint8_t* p = base + g.offsets[i] * item;
    v[i] = load_as_double(p, g.view.dtype, 0);
    if (poisoned && std::memcmp(p, poison, size_t(item)) == 0) (*poisoned)[i] = true;
  }
  return v;
}

Tensor make_tensor(const Shape& shape, DType dtype, Device device, const std::vector<double>& values) {
  Tensor host = Tensor::empty(shape, dtype, Device::cpu());
  for (size_t i = 0; i < values.size(); ++i) store_from_double(host.data(), dtype, int64_t(i), values[i]);
  if (device.is_cpu()) return host;
  return Tensor::copy_of(host.view(), device, dtype);
}

std::vector<double> tensor_values(const TensorView& t) {
  Tensor host = Tensor::copy_of(t, Device::cpu(), t.dtype);
  std::vector<double> v(size_t(host.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_double(host.data(), host.dtype(), int64_t(i));
  return v;
}

}  // namespace opforge::harness::detail
