// Devices: the host CPU and CUDA GPUs by ordinal ("cpu", "cuda:0").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace opforge {

enum class DeviceKind : uint8_t { cpu, cuda };
inline constexpr DeviceKind kAllDeviceKinds[] = {DeviceKind::cpu, DeviceKind::cuda};

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceKind::cuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string str() const;  // "cpu", "cuda:0"
};

const char* device_kind_name(DeviceKind k);
// "cpu", "cuda", "cuda:N". Throws Error(unknown_name) otherwise.
Device parse_device(std::string_view text);

// An execution stream: a cudaStream_t on CUDA (nullptr = the default stream), unused on CPU.
// Kernels receive it with every call and enqueue their work on it.
struct Stream {
  void* handle = nullptr;
};

}  // namespace opforge
