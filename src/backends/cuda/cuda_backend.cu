// The CUDA backend: memory hooks, the availability probe, device properties, the workspace cache
// and an event timer. Kernels live with their op family (ops/<family>/cuda.cu).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_launch.cuh"

namespace opforge {
namespace cuda {

void throw_cuda_error(const char* what, cudaError_t status) {
  throw Error(ErrorCode::backend, std::string(what) + " failed: " + cudaGetErrorString(status));
}

// Note [current stream].
namespace {
thread_local cudaStream_t t_current_stream = nullptr;
}
cudaStream_t current_stream() { return t_current_stream; }
CurrentStreamScope::CurrentStreamScope(cudaStream_t s) : previous_(t_current_stream) {
  t_current_stream = s;
}
CurrentStreamScope::~CurrentStreamScope() { t_current_stream = previous_; }

}  // namespace cuda

namespace {

using cuda::check;

// ---- memory hooks (synchronous: tools and harness, never a kernel's hot path) ---------------------
void* cuda_allocate(int64_t bytes, int device_index) {
  cuda::DeviceGuard guard(device_index);
  void* p = nullptr;
  cudaError_t status = cudaMalloc(&p, size_t(bytes));
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so that the next launch check does not report it again
    throw Error(ErrorCode::backend, "cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" +
                                        std::to_string(device_index) +
                                        " failed: " + cudaGetErrorString(status));
  }
  return p;
}

// Called from a tensor's deleter, which must not throw: a failure is reported once as a warning.
void cuda_release(void* p, int device_index) {
  int previous = 0;
  cudaGetDevice(&previous);
  if (previous != device_index) cudaSetDevice(device_index);
  cudaError_t status = cudaFree(p);
  if (previous != device_index) cudaSetDevice(previous);
  if (status != cudaSuccess)
    warn_once("cudaFree", std::string("cudaFree failed: ") + cudaGetErrorString(status));
}

void cuda_to_host(void* dst, const void* src, int64_t bytes, int device_index) {
  cuda::DeviceGuard guard(device_index);
  check(cudaMemcpy(dst, src, size_t(bytes), cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
}

void cuda_to_device(void* dst, const void* src, int64_t bytes, int device_index) {
  cuda::DeviceGuard guard(device_index);
  check(cudaMemcpy(dst, src, size_t(bytes), cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
}

// cudaMemcpy between device buffers returns before the copy ends; the hook promises a finished copy.
void cuda_device_to_device(void* dst, const void* src, int64_t bytes, int device_index) {
  cuda::DeviceGuard guard(device_index);
  check(cudaMemcpy(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice), "cudaMemcpy (device to device)");
  check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

void cuda_copy_rows_async(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                          int64_t rows, int device_index) {
  cuda::DeviceGuard guard(device_index);
  check(cudaMemcpy2DAsync(dst, size_t(dst_pitch), src, size_t(src_pitch), size_t(width), size_t(rows),
                          cudaMemcpyDeviceToDevice, cuda::current_stream()),
        "cudaMemcpy2DAsync (device to device)");
}

void cuda_synchronize(int device_index) {
  cuda::DeviceGuard guard(device_index);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// ---- availability (Note [cuda availability]) ------------------------------------------------------
__global__ void probe_kernel(int* out) {
  if (out) *out = 1;
}

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// Why device `i` cannot run the kernels, or "" when it can.
std::string device_problem(int i) {
  cudaDeviceProp prop{};
  if (cudaError_t s = cudaGetDeviceProperties(&prop, i); s != cudaSuccess)
    return "cudaGetDeviceProperties(" + std::to_string(i) + ") failed: " + cudaGetErrorString(s);
  std::string name = "cuda:" + std::to_string(i) + " (" + prop.name + ", compute capability " +
                     std::to_string(prop.major) + "." + std::to_string(prop.minor) + ")";
  if (prop.major < 9)
    return name + " is older than compute capability 9.0; opforge's CUDA kernels are built for sm_90";
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(i);
  cudaFuncAttributes attr{};
  cudaError_t s = cudaFuncGetAttributes(&attr, probe_kernel);
  cudaSetDevice(previous);
  if (s != cudaSuccess) {
    cudaGetLastError();
    return name + ": no loadable kernel image (" + cudaGetErrorString(s) + ")";
  }
  return "";
}

Availability probe_once() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0)
    return {false, "no CUDA driver is installed (runtime " + version_text(runtime) + ")"};
  if (driver < runtime)
    return {false, "the CUDA driver (" + version_text(driver) + ") is older than the runtime (" +
                       version_text(runtime) + ") opforge was built with"};
  int count = 0;
  cudaError_t s = cudaGetDeviceCount(&count);
  if (s == cudaErrorNoDevice || (s == cudaSuccess && count == 0)) {
    cudaGetLastError();
    return {false, "no CUDA device is visible"};
  }
  if (s != cudaSuccess) {
    cudaGetLastError();
    if (s == cudaErrorInsufficientDriver)
      return {false, "the CUDA driver (" + version_text(driver) + ") is older than the runtime (" +
                         version_text(runtime) + ")"};
    return {false, std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(s)};
  }
  for (int i = 0; i < count; ++i)
    if (std::string why = device_problem(i); !why.empty()) return {false, why};
  return {true, ""};
}

// ---- workspace (Note [cuda workspace]) ------------------------------------------------------------
struct Workspace {
  void* data = nullptr;
  int64_t bytes = 0;
  unsigned* barrier = nullptr;  // Note [grid barrier]: two words, zero between launches
};
struct WorkspaceCache {
  std::mutex mutex;
  std::map<std::pair<int, void*>, Workspace> buffers;
  ~WorkspaceCache() {
    for (auto& [key, w] : buffers) {  // at exit; errors ignored (driver may be gone)
      cudaFree(w.data);
      cudaFree(w.barrier);
    }
  }
};
WorkspaceCache& workspace_cache() {
  static WorkspaceCache cache;
  return cache;
}


// Note [graph timing]: perf mode's device timer. `batch` calls are captured into one CUDA graph on
// a private stream (made current for the calls, Note [current stream]) and the graph is replayed
// `reps` times between CUDA events; the median replay over `batch` is the time of one call. A
// replay launches the kernels back to back with no host work between them, so even a 2 us kernel
// is timed as the device runs it (kernel time plus the device's own launch gap), not as fast as the
// host can enqueue it. Returns a negative value when the calls cannot be captured (they use another
// stream, synchronize, or allocate), and the caller falls back to events around plain calls.
// One timing stream per device, kept for the process (so per-stream workspaces are made once).
cudaStream_t timing_stream() {
  static std::mutex mutex;
  static std::map<int, cudaStream_t> streams;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  cudaStream_t& s = streams[device];
  if (!s && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) s = nullptr;
  return s;
}

double graph_median_us(void (*fn)(void*), void* arg, int batch, int reps) {
  cudaStream_t stream = timing_stream();
  if (!stream) {
    cudaGetLastError();
    return -1;
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  double result = -1;
  try {
    cuda::CurrentStreamScope scope(stream);
    fn(arg);  // first call on this stream: per-stream workspaces are allocated outside the capture
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      for (int i = 0; i < batch; ++i) fn(arg);
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      throw;
    }
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    size_t nodes = 0;
    check(cudaGraphGetNodes(graph, nullptr, &nodes), "cudaGraphGetNodes");
    if (nodes >= size_t(batch)) {  // every call launched its work on the captured stream
      check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
      check(cudaEventCreate(&start), "cudaEventCreate");
      check(cudaEventCreate(&stop), "cudaEventCreate");
      for (int i = 0; i < 2; ++i) check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      std::vector<float> ms(size_t(std::max(reps, 1)));
      for (float& t : ms) {
        check(cudaEventRecord(start, stream), "cudaEventRecord");
        check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
        check(cudaEventRecord(stop, stream), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
      }
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      result = double(ms[ms.size() / 2]) * 1000.0 / batch;
    }
  } catch (const std::exception&) {
    result = -1;
  }
  cudaGetLastError();  // a refused capture is not an error of the next launch
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamSynchronize(stream);
  return result;
}

double cuda_time_calls_us(void (*fn)(void*), void* arg, int warmup, int batch, int reps,
                          int device_index) {
  cuda::DeviceGuard guard(device_index);
  for (int i = 0; i < warmup; ++i) fn(arg);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (const double us = graph_median_us(fn, arg, batch, reps); us > 0) return us;
  return cuda_median_us(device_index, [fn, arg] { fn(arg); }, 0, reps, batch);
}

std::string cuda_device_name(int device_index) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device_index), "cudaGetDeviceProperties");
  return prop.name;
}

}  // namespace

void register_cuda_backend(Registry&) {
  DeviceMemoryOps ops;
  ops.allocate = &cuda_allocate;
  ops.release = &cuda_release;
  ops.to_host = &cuda_to_host;
  ops.to_device = &cuda_to_device;
  ops.device_to_device = &cuda_device_to_device;
  ops.synchronize = &cuda_synchronize;
  ops.copy_rows_async = &cuda_copy_rows_async;
  ops.time_calls_us = &cuda_time_calls_us;
  ops.device_name = &cuda_device_name;
  install_device_memory_ops(DeviceKind::cuda, ops);
}

KernelDesc cuda_kernel_desc(std::string impl, int priority, std::string summary, bool in_place) {
  KernelDesc d;
  d.impl = std::move(impl);
  d.device = DeviceKind::cuda;
  d.priority = priority;
  d.summary = std::move(summary);
  d.properties.deterministic = true;
  d.properties.batch_invariant = true;
  d.properties.in_place = in_place;
  d.dtypes = {DType::f32, DType::f16, DType::bf16};
  d.probe = &cuda_availability;
  return d;
}

Availability cuda_availability() {
  static const Availability answer = [] {
    try {
      return probe_once();
    } catch (const std::exception& e) {
      return Availability{false, std::string("CUDA probe failed: ") + e.what()};
    }
  }();
  return answer;
}

const CudaDeviceProps& cuda_device_props(int device_index) {
  constexpr int kMaxDevices = 64;
  static CudaDeviceProps props[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  if (device_index < 0 || device_index >= kMaxDevices)
    throw Error(ErrorCode::invalid_argument, "CUDA device index " + std::to_string(device_index) +
                                                 " is out of range");
  std::call_once(once[device_index], [device_index] {
    CudaDeviceProps p;
    p.index = device_index;
    auto attr = [device_index](cudaDeviceAttr a, const char* name) {
      int v = 0;
      check(cudaDeviceGetAttribute(&v, a, device_index), name);
      return v;
    };
    p.sm_count = attr(cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(MultiProcessorCount)");
    p.cc_major = attr(cudaDevAttrComputeCapabilityMajor, "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
    p.cc_minor = attr(cudaDevAttrComputeCapabilityMinor, "cudaDeviceGetAttribute(ComputeCapabilityMinor)");
    p.max_threads_per_sm = attr(cudaDevAttrMaxThreadsPerMultiProcessor, "cudaDeviceGetAttribute(MaxThreadsPerMultiProcessor)");
    p.max_threads_per_block = attr(cudaDevAttrMaxThreadsPerBlock, "cudaDeviceGetAttribute(MaxThreadsPerBlock)");
    p.shared_per_block = attr(cudaDevAttrMaxSharedMemoryPerBlock, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlock)");
    p.shared_per_block_optin = attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    p.shared_per_sm = attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)");
    p.l2_bytes = attr(cudaDevAttrL2CacheSize, "cudaDeviceGetAttribute(L2CacheSize)");
    p.regs_per_sm = attr(cudaDevAttrMaxRegistersPerMultiprocessor, "cudaDeviceGetAttribute(MaxRegistersPerMultiprocessor)");
    props[device_index] = p;
  });
  return props[device_index];
}

bool cuda::programmatic_launch_enabled(int device_index) {
  static const bool allowed = !env_off("OPFORGE_CUDA_PDL");
  return allowed && cuda_device_props(device_index).cc_major >= 9;
}

bool cuda::cluster_rows_enabled() {
  static const bool enabled = !env_off("OPFORGE_CUDA_CLUSTER_ROWS");
  return enabled;
}

bool cuda::many_row_clusters_enabled() {
  static const bool enabled = !env_off("OPFORGE_CUDA_MANY_ROW_CLUSTERS");
  return enabled;
}

int cuda::cluster_max_active(int device_index, const void* kernel, int cluster, int threads, size_t smem) {
  if (cuda_device_props(device_index).cc_major < 9) return 0;
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device_index, kernel, cluster, threads, smem);
  if (auto it = known.find(key); it != known.end()) return it->second;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(cluster));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.attrs = attr;
  config.numAttrs = 1;
  int clusters = 0;
  const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  if (status != cudaSuccess) cudaGetLastError();  // a refusal means "does not fit", not an error
  return known[key] = status == cudaSuccess ? clusters : 0;
}

int64_t cuda::dynamic_smem_room(const void* kernel, const CudaDeviceProps& props) {
  cudaFuncAttributes attr{};
  OPFORGE_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const int64_t most = props.shared_per_block_optin - int64_t(attr.sharedSizeBytes);
  OPFORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)));
  return most;
}

bool cuda::cluster_launch_fits(int device_index, const void* kernel, int cluster, int threads, size_t smem) {
  return cluster_max_active(device_index, kernel, cluster, threads, smem) > 0;
}

int64_t cuda_workspace_bytes_for(int64_t bytes) {
  constexpr int64_t kStep = int64_t(8) << 20;
  if (bytes > 8 * kStep) return (bytes + kStep - 1) / kStep * kStep;
  int64_t p = 1 << 20;  // at least 1 MiB: small shapes never grow it
  while (p < bytes) p *= 2;
  return p;
}

void* cuda_workspace(const Context& ctx, int64_t bytes) {
  WorkspaceCache& cache = workspace_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  Workspace& w = cache.buffers[{ctx.device.index, static_cast<void*>(cuda::stream_of(ctx))}];
  if (w.bytes >= bytes) return w.data;
  cuda::DeviceGuard guard(ctx.device.index);
  if (w.data) {
    // Earlier calls on this stream may still read the old buffer.
    check(cudaStreamSynchronize(cuda::stream_of(ctx)), "cudaStreamSynchronize (workspace growth)");
    check(cudaFree(w.data), "cudaFree (workspace)");
    w = {};
  }
  const int64_t size = cuda_workspace_bytes_for(bytes);
  check(cudaMalloc(&w.data, size_t(size)), "cudaMalloc (workspace)");
  w.bytes = size;
  return w.data;
}

unsigned* cuda_grid_barrier(const Context& ctx) {
  WorkspaceCache& cache = workspace_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  Workspace& w = cache.buffers[{ctx.device.index, static_cast<void*>(cuda::stream_of(ctx))}];
  if (w.barrier) return w.barrier;
  cuda::DeviceGuard guard(ctx.device.index);
  void* p = nullptr;
  check(cudaMalloc(&p, 2 * sizeof(unsigned)), "cudaMalloc (grid barrier)");
  check(cudaMemset(p, 0, 2 * sizeof(unsigned)), "cudaMemset (grid barrier)");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (grid barrier)");
  w.barrier = static_cast<unsigned*>(p);
  return w.barrier;
}

double cuda_graph_median_us(int device_index, const std::function<void()>& fn, int repeats,
                            int calls_per_sample) {
  cuda::DeviceGuard guard(device_index);
  auto call = [](void* p) { (*static_cast<const std::function<void()>*>(p))(); };
  return graph_median_us(call, const_cast<std::function<void()>*>(&fn), std::max(calls_per_sample, 1),
                         repeats);
}

void* cuda_create_stream(int device_index) {
  cuda::DeviceGuard guard(device_index);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

void cuda_destroy_stream(int device_index, void* stream) {
  cuda::DeviceGuard guard(device_index);
  auto* s = static_cast<cudaStream_t>(stream);
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  WorkspaceCache& cache = workspace_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (auto it = cache.buffers.find({device_index, stream}); it != cache.buffers.end()) {
      cudaFree(it->second.data);
      cudaFree(it->second.barrier);
      cache.buffers.erase(it);
    }
  }
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
}

int64_t cuda_free_memory_bytes(int device_index) {
  cuda::DeviceGuard guard(device_index);
  size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return int64_t(free_bytes);
}

double cuda_median_us(int device_index, const std::function<void()>& fn, int warmup, int repeats,
                      int calls_per_sample) {
  calls_per_sample = std::max(calls_per_sample, 1);
  cuda::DeviceGuard guard(device_index);
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> ms(size_t(std::max(repeats, 1)));
  for (float& t : ms) {
    check(cudaEventRecord(start, nullptr), "cudaEventRecord");
    for (int i = 0; i < calls_per_sample; ++i) fn();
    check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return double(ms[ms.size() / 2]) * 1000.0 / calls_per_sample;
}

}  // namespace opforge
