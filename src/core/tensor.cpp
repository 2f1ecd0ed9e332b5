#include "opforge/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "opforge/error.h"

namespace opforge {

// ---- Shape -----------------------------------------------------------------------------------
static void check_dims(size_t n) {
  if (n > size_t(kMaxDims))
    throw Error(ErrorCode::invalid_argument,
                "tensor rank " + std::to_string(n) + " exceeds the maximum of " + std::to_string(kMaxDims));
}

Shape::Shape(std::initializer_list<int64_t> d) : Shape(std::span<const int64_t>(d.begin(), d.size())) {}

Shape::Shape(std::span<const int64_t> d) {
  check_dims(d.size());
  ndim = int(d.size());
  // Note [shape bound]: the product of the dims, each counted as at least 1, fits in int64. Then
  // numel and every contiguous stride fit too, also for shapes with a zero dim.
  int64_t extent = 1;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0) throw Error(ErrorCode::invalid_argument, "negative dimension " + std::to_string(d[i]));
    if (__builtin_mul_overflow(extent, std::max<int64_t>(d[i], 1), &extent))
      throw Error(ErrorCode::invalid_argument, "a shape of " + std::to_string(d.size()) +
                                                   " dims whose product exceeds 2^63 elements");
    dims[i] = d[i];
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[size_t(i)];
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[size_t(i)]);
  return s + "]";
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.ndim != b.ndim) return false;
  return std::equal(a.dims.begin(), a.dims.begin() + a.ndim, b.dims.begin());
}

// ---- TensorView ------------------------------------------------------------------------------
TensorView::TensorView(void* d, DType t, const Shape& s, Device dev)
    : data(d), dtype(t), device(dev), ndim(s.ndim) {
  int64_t stride = 1;
  for (int i = s.ndim - 1; i >= 0; --i) {
    shape[size_t(i)] = s[i];
    strides[size_t(i)] = stride;
    stride *= std::max<int64_t>(s[i], 1);
  }
}

TensorView::TensorView(void* d, DType t, const Shape& s, std::span<const int64_t> st, Device dev)
    : data(d), dtype(t), device(dev), ndim(s.ndim) {
  if (st.size() != size_t(s.ndim))
    throw Error(ErrorCode::invalid_argument, "strides rank differs from shape rank");
  for (int i = 0; i < s.ndim; ++i) {
    shape[size_t(i)] = s[i];
    strides[size_t(i)] = st[size_t(i)];
  }
}

Shape TensorView::shape_of() const {
  return Shape(std::span<const int64_t>(shape.data(), size_t(std::max(ndim, 0))));
}

int64_t TensorView::numel() const {
  if (ndim < 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[size_t(i)];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[size_t(i)] != 1 && strides[size_t(i)] != expected) return false;
    expected *= shape[size_t(i)];
  }
  return true;
}

int64_t TensorView::rows() const {
  if (ndim <= 1) return ndim < 0 ? 0 : 1;
  int64_t r = 1;
  for (int i = 0; i < ndim - 1; ++i) r *= shape[size_t(i)];
  return r;
}

bool TensorView::rows_are_uniform() const {
  if (ndim < 1) return ndim == 0;
  if (shape[size_t(ndim - 1)] > 1 && strides[size_t(ndim - 1)] != 1) return false;
  // Leading dims must nest: stride[i] == stride[i+1] * shape[i+1] for i < ndim-2 (size-1 dims free).
  for (int i = ndim - 3; i >= 0; --i) {
    if (shape[size_t(i)] == 1) continue;
    if (strides[size_t(i)] != strides[size_t(i + 1)] * shape[size_t(i + 1)]) return false;
  }
  return true;
}

int64_t TensorView::row_stride() const {
  if (ndim <= 1) return ndim == 1 ? shape[0] : 1;
  // The innermost row dim of size > 1 gives the stride; if all are 1 any value works.
  for (int i = ndim - 2; i >= 0; --i)
    if (shape[size_t(i)] != 1) return strides[size_t(i)];
  return shape[size_t(ndim - 1)];
}

std::pair<const char*, const char*> TensorView::byte_span() const {
  const char* base = static_cast<const char*>(data);
  if (!defined() || numel() == 0 || base == nullptr) return {base, base};
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < ndim; ++i) {
    int64_t extent = (shape[size_t(i)] - 1) * strides[size_t(i)];
    (extent < 0 ? lo : hi) += extent;
  }
  return {base + lo * itemsize(), base + (hi + 1) * itemsize()};
}

std::string TensorView::str() const {
  if (!defined()) return "none";
  std::string s = std::string(dtype_name(dtype)) + shape_of().str();
  if (!is_contiguous()) {
    s += " strides (";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(strides[size_t(i)]);
    s += ")";
  }
  return s + " " + device.str();
}

bool overlaps(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined() || !(a.device == b.device)) return false;
  auto [a0, a1] = a.byte_span();
  auto [b0, b1] = b.byte_span();
  if (a0 == a1 || b0 == b1) return false;
  return a0 < b1 && b0 < a1;
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || !(a.device == b.device) || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[size_t(i)] != b.shape[size_t(i)] || a.strides[size_t(i)] != b.strides[size_t(i)]) return false;
  return true;
}

// ---- device memory hooks ---------------------------------------------------------------------
static DeviceMemoryOps g_device_ops[2];
static bool g_device_ops_installed[2] = {false, false};

void install_device_memory_ops(DeviceKind kind, const DeviceMemoryOps& ops) {
  g_device_ops[int(kind)] = ops;
  g_device_ops_installed[int(kind)] = true;
}

const DeviceMemoryOps* device_memory_ops(DeviceKind kind) {
  return g_device_ops_installed[int(kind)] ? &g_device_ops[int(kind)] : nullptr;
}

static const DeviceMemoryOps& require_ops(Device d) {
  const DeviceMemoryOps* ops = device_memory_ops(d.kind);
  if (!ops)
    throw Error(ErrorCode::not_available,
                "device " + d.str() + " is not available: opforge was built without its backend");
  return *ops;
}

void copy_bytes(void* dst, Device dd, const void* src, Device sd, int64_t bytes) {
  if (bytes <= 0) return;
  if (dd.is_cpu() && sd.is_cpu()) {
    std::memmove(dst, src, size_t(bytes));
  } else if (dd.is_cpu()) {
    require_ops(sd).to_host(dst, src, bytes, sd.index);
  } else if (sd.is_cpu()) {
    require_ops(dd).to_device(dst, src, bytes, dd.index);
  } else {
    if (dd.index != sd.index)
      throw Error(ErrorCode::invalid_argument, "copy between " + sd.str() + " and " + dd.str() + " is not supported");
    require_ops(dd).device_to_device(dst, src, bytes, dd.index);
  }
}

// ---- Tensor ----------------------------------------------------------------------------------
Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  int64_t n = shape.numel();
  if (n > std::numeric_limits<int64_t>::max() / 8)
    throw Error(ErrorCode::invalid_argument, "tensor of " + shape.str() + " is too large");
  int64_t bytes = n * dtype_size(dtype);
  if (device.is_cpu()) {
    // 64-byte aligned (a cache line, and the widest SIMD load); size rounded up as aligned_alloc wants.
    size_t rounded = size_t((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw Error(ErrorCode::invalid_argument, "out of host memory allocating " + std::to_string(bytes) + " bytes");
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    const DeviceMemoryOps& ops = require_ops(device);
    void* p = bytes > 0 ? ops.allocate(bytes, device.index) : nullptr;
    int index = device.index;
    auto release = ops.release;
    t.storage_ = std::shared_ptr<void>(p, [release, index](void* q) { if (q) release(q, index); });
  }
  t.view_ = TensorView(t.storage_.get(), dtype, shape, device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device.is_cpu()) {
    std::memset(t.data(), 0, size_t(t.nbytes()));
  } else {
    Tensor host = zeros(shape, dtype, Device::cpu());
    copy_bytes(t.data(), device, host.data(), Device::cpu(), t.nbytes());
  }
  return t;
}

// Visit every element of a strided view in C order, calling f(linear_index, element_offset).
template <class F> static void for_each_offset(const TensorView& v, F&& f) {
  int64_t n = v.numel();
  if (n == 0) return;
  std::array<int64_t, kMaxDims> idx{};
  int64_t offset = 0;
  for (int64_t linear = 0; linear < n; ++linear) {
    f(linear, offset);
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < v.shape[size_t(d)]) {
        offset += v.strides[size_t(d)];
        break;
      }
      offset -= (v.shape[size_t(d)] - 1) * v.strides[size_t(d)];
      idx[size_t(d)] = 0;
    }
  }
}

void copy_into(const TensorView& dst, const TensorView& src) {
  if (!(dst.shape_of() == src.shape_of()))
    throw Error(ErrorCode::invalid_argument,
                "copy: shapes differ: " + dst.shape_of().str() + " vs " + src.shape_of().str());
  if (src.numel() == 0) return;  // nothing to move, whatever strides an empty view carries
  if (dst.dtype == src.dtype && dst.is_contiguous() && src.is_contiguous()) {
    copy_bytes(dst.data, dst.device, src.data, src.device, src.numel() * src.itemsize());
    return;
  }
  if (!dst.device.is_cpu() || !src.device.is_cpu()) {
    // Stage through the host: bring the source's byte span over as it is (strides kept), convert
    // on the host, send a contiguous result.
    TensorView host_src = src;
    Tensor staged;
    if (!src.device.is_cpu()) {
      auto [lo, hi] = src.byte_span();
      staged = Tensor::empty(Shape{int64_t(hi - lo)}, DType::u8, Device::cpu());
      copy_bytes(staged.data(), Device::cpu(), lo, src.device, int64_t(hi - lo));
      host_src.data = static_cast<char*>(staged.data()) + (static_cast<const char*>(src.data) - lo);
      host_src.device = Device::cpu();
    }
    if (dst.device.is_cpu()) {
      copy_into(dst, host_src);
      return;
    }
    if (!dst.is_contiguous())
      throw Error(ErrorCode::invalid_argument, "copy: strided destinations on " + dst.device.str() + " are not supported");
    Tensor d = Tensor::empty(dst.shape_of(), dst.dtype, Device::cpu());
    copy_into(d.view(), host_src);
    copy_bytes(dst.data, dst.device, d.data(), Device::cpu(), d.nbytes());
    return;
  }
  std::vector<int64_t> src_offsets;
  src_offsets.reserve(size_t(src.numel()));
  for_each_offset(src, [&](int64_t, int64_t off) { src_offsets.push_back(off); });
  if (dst.dtype == src.dtype) {  // exact: bytes, whatever the dtype (NaN payloads, large i64)
    const int64_t size = dst.itemsize();
    for_each_offset(dst, [&](int64_t i, int64_t off) {
      std::memcpy(static_cast<char*>(dst.data) + off * size,
                  static_cast<const char*>(src.data) + src_offsets[size_t(i)] * size, size_t(size));
    });
    return;
  }
  for_each_offset(dst, [&](int64_t i, int64_t off) {
    store_from_double(dst.data, dst.dtype, off, load_as_double(src.data, src.dtype, src_offsets[size_t(i)]));
  });
}

Tensor Tensor::copy_of(const TensorView& src, Device device, DType dtype) {
  Tensor t = empty(src.shape_of(), dtype, device);
  copy_into(t.view(), src);
  return t;
}

}  // namespace opforge
