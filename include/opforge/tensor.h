// TensorView (non-owning) and Tensor (owning).
//
// A TensorView is a pointer plus dtype, device, shape and strides, all sizes and strides in int64
// elements (never bytes), so no index arithmetic can overflow at 2^31 elements. Views are cheap
// values (no heap) and are passed to kernels by const reference.
//
// A default-constructed view is "none" (ndim == -1): the value of an optional tensor argument.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "opforge/device.h"
#include "opforge/dtype.h"

namespace opforge {

inline constexpr int kMaxDims = 8;

struct Shape {
  int ndim = 0;
  std::array<int64_t, kMaxDims> dims{};

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  explicit Shape(std::span<const int64_t> d);
  int64_t operator[](int i) const { return dims[size_t(i)]; }
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {dims.begin(), dims.begin() + ndim}; }
  std::string str() const;  // "[1024, 4096]"
  friend bool operator==(const Shape& a, const Shape& b);
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int ndim = -1;  // -1: none
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  TensorView() = default;
  // Contiguous (C order) view of `shape` at `data`.
  TensorView(void* data, DType dtype, const Shape& shape, Device device = Device::cpu());
  // Strided view; strides in elements.
  TensorView(void* data, DType dtype, const Shape& shape, std::span<const int64_t> strides,
             Device device = Device::cpu());

  bool defined() const { return ndim >= 0; }
  Shape shape_of() const;
  // size/stride with Python-style negative dims.
  int64_t size(int d) const { return shape[size_t(d < 0 ? d + ndim : d)]; }
  int64_t stride(int d) const { return strides[size_t(d < 0 ? d + ndim : d)]; }
  int64_t numel() const;
  int64_t itemsize() const { return dtype_size(dtype); }
  bool is_contiguous() const;
  // Rows = every dim but the last, flattened. True when the last dim has stride 1 and the leading
  // dims can be walked as rows with one row stride (row_stride() below).
  bool rows_are_uniform() const;
  int64_t rows() const;         // product of all dims but the last (1 for 1-D, 0 if any is 0)
  int64_t row_stride() const;   // stride between consecutive rows; requires rows_are_uniform()
  // [begin, end) byte span the view can touch (for aliasing checks and guards).
  std::pair<const char*, const char*> byte_span() const;

  template <class T> T* ptr() const { return static_cast<T*>(data); }
  std::string str() const;  // "bf16[1024, 4096] cpu" (or "none")
};

// True when the byte spans of a and b intersect (both defined and non-empty).
bool overlaps(const TensorView& a, const TensorView& b);
// True when a and b describe exactly the same elements (same data, dtype, shape, strides).
bool same_view(const TensorView& a, const TensorView& b);

// Owning tensor. CPU memory is 64-byte aligned; CUDA memory comes from cudaMalloc through the
// CUDA backend (Error if opforge was built without it or the device is absent).
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  // A contiguous copy of `src` on `device` with `dtype` (conversion through double for mixed
  // dtypes on CPU; a CUDA source is staged through the host).
  static Tensor copy_of(const TensorView& src, Device device, DType dtype);
  static Tensor copy_of(const TensorView& src) { return copy_of(src, src.device, src.dtype); }

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: a Tensor is usable as a view
  void* data() const { return view_.data; }
  DType dtype() const { return view_.dtype; }
  Device device() const { return view_.device; }
  int64_t numel() const { return view_.numel(); }
  Shape shape() const { return view_.shape_of(); }
  int64_t nbytes() const { return numel() * dtype_size(view_.dtype); }
  bool defined() const { return view_.defined(); }
  template <class T> T* ptr() const { return view_.ptr<T>(); }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

// ---- device memory hooks -----------------------------------------------------------------
// The core knows nothing of CUDA; the CUDA backend installs these at registration. All byte
// counts are int64. Copies are synchronous (tools and harness only, never a kernel's hot path).
struct DeviceMemoryOps {
  void* (*allocate)(int64_t bytes, int device_index) = nullptr;
  void (*release)(void* p, int device_index) = nullptr;
  void (*to_host)(void* dst_host, const void* src_dev, int64_t bytes, int device_index) = nullptr;
  void (*to_device)(void* dst_dev, const void* src_host, int64_t bytes, int device_index) = nullptr;
  void (*device_to_device)(void* dst, const void* src, int64_t bytes, int device_index) = nullptr;
  void (*synchronize)(int device_index) = nullptr;
  // `rows` rows of `width` bytes from src (rows `src_pitch` bytes apart) to dst (`dst_pitch`
  // apart), enqueued on the current stream without waiting (capturable in a CUDA graph).
  void (*copy_rows_async)(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                          int64_t rows, int device_index) = nullptr;
  // Timing for the harness's perf mode: runs fn(arg) `warmup` times, then `reps` samples of
  // `batch` back-to-back calls between two device events; returns the median per-call time of the
  // samples in microseconds. The CUDA backend captures the `batch` calls in a graph and replays it
  // (device time without host enqueue gaps), falling back to plain calls on the default stream
  // when the calls cannot be captured (Note [graph timing] in src/backends/cuda/cuda_backend.cu).
  double (*time_calls_us)(void (*fn)(void*), void* arg, int warmup, int batch, int reps,
                          int device_index) = nullptr;
  // Device name, e.g. "NVIDIA H100 80GB HBM3" (for reports).
  std::string (*device_name)(int device_index) = nullptr;
};
void install_device_memory_ops(DeviceKind kind, const DeviceMemoryOps& ops);
const DeviceMemoryOps* device_memory_ops(DeviceKind kind);  // nullptr when not installed

// Raw byte copy between any two devices (synchronous).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes);
// Element-wise copy with dtype conversion; shapes must match; views may be strided. CPU only on
// both sides unless dtypes match and both are contiguous (then any devices).
void copy_into(const TensorView& dst, const TensorView& src);

}  // namespace opforge
