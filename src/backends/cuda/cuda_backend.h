// The CUDA backend: device memory hooks, the availability probe shared by every CUDA kernel, cached
// device properties for launch shapes, and a per-stream workspace for multi-pass kernels.
//
// This header is plain C++ (no CUDA headers), so registration code and tests compiled by the host
// compiler can include it. Kernel files include cuda_launch.cuh for the device-side helpers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

// Installs DeviceMemoryOps for DeviceKind::cuda (cudaMalloc / cudaFree / cudaMemcpy, each checked:
// a failed call throws Error(backend, "<call> failed: <reason>")). Registers no kernel itself;
// register_norm_cuda and register_activation_cuda do that.
void register_cuda_backend(Registry& reg);

// Note [cuda availability]: the probe of every CUDA kernel. Never throws and never crashes; when
// CUDA cannot run opforge's kernels it says why: no driver, a driver older than the runtime, no
// device, a device whose compute capability is below 9.0 (the kernels are built for sm_90), or no
// kernel image loadable on a device. Checked once per process (the answer is cached); every visible
// device must qualify.
Availability cuda_availability();

// The KernelDesc every CUDA kernel starts from: DeviceKind::cuda, dtypes {f32, f16, bf16},
// deterministic, probe = cuda_availability.
KernelDesc cuda_kernel_desc(std::string impl, int priority, std::string summary, bool in_place);

// Properties of one device, read once per device (cudaDeviceGetAttribute) and cached.
struct CudaDeviceProps {
  int index = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int max_threads_per_sm = 0;
  int max_threads_per_block = 0;
  int64_t shared_per_block = 0;        // default dynamic limit (48 KiB)
  int64_t shared_per_block_optin = 0;  // after cudaFuncSetAttribute
  int64_t shared_per_sm = 0;
  int64_t l2_bytes = 0;
  int regs_per_sm = 0;
};
// Throws Error(backend) when the device cannot be queried.
const CudaDeviceProps& cuda_device_props(int device_index);

// Note [cuda workspace]: scratch device memory for kernels that need a second pass (the
// deterministic dw reduction of the norm backward kernels). One buffer per (device, stream) (the
// stream a launch would use, Note [current stream] in cuda_launch.cuh),
// allocated on first use and grown when a call needs more (to cuda_workspace_bytes_for(bytes): the
// next power of two up to 64 MiB, a multiple of 8 MiB above, so a big request does not hold up to
// twice its size); never shrunk, released at process exit. Calls on one stream are ordered, so they may share the buffer; calls on
// different streams get different buffers. Growing synchronizes the stream before freeing the old
// buffer, so the first call with a larger shape pays one allocation; every later call does a
// mutex-guarded lookup only. Do the first call outside CUDA graph capture (cudaMalloc cannot be
// captured); later calls capture fine.
void* cuda_workspace(const Context& ctx, int64_t bytes);
int64_t cuda_workspace_bytes_for(int64_t bytes);  // what a request of `bytes` allocates

// Note [grid barrier]: a zeroed word of device memory per (device, stream) for kernels that
// launch cooperatively and meet at a grid-wide barrier (cuda_launch.cuh); each barrier leaves its
// low bits as it found them, so launches in stream order (graph replays too) share it. Allocated on
// the first call (outside graph capture), never freed before exit.
unsigned* cuda_grid_barrier(const Context& ctx);

// Free device memory in bytes (cudaMemGetInfo), for tests that need to skip huge cases.
int64_t cuda_free_memory_bytes(int device_index);

// A new non-blocking stream on the device, with no workspace yet (Note [cuda workspace]): for
// measuring the extra memory an op's calls make the backend hold. cuda_destroy_stream waits for
// the stream, frees its workspace and barrier words, and destroys it.
void* cuda_create_stream(int device_index);
void cuda_destroy_stream(int device_index, void* stream);

// Median time in microseconds of one call of `fn`, which enqueues work on the default stream of
// `device_index`: after `warmup` calls, `repeats` samples, each CUDA events around
// `calls_per_sample` back-to-back calls (divided by that count, so launch gaps of small kernels
// are averaged in the way a model's stream of launches sees them). For tests and notes; the
// harness has its own timer.
double cuda_median_us(int device_index, const std::function<void()>& fn, int warmup, int repeats,
                      int calls_per_sample = 1);

// The same with the calls captured in a CUDA graph and replayed (Note [graph timing] in
// cuda_backend.cu): the device's time per call without host enqueue gaps. Negative when the calls
// cannot be captured (they synchronize, allocate, or launch on a stream other than the current one).
double cuda_graph_median_us(int device_index, const std::function<void()>& fn, int repeats,
                            int calls_per_sample = 20);

}  // namespace opforge
