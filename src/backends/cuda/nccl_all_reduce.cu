// NCCL all-reduce across the GPUs of one host (src/backends/comm.h): one process, one
// communicator per GPU from ncclCommInitAll, each rank on its own non-blocking stream, the ranks'
// calls fused in a ncclGroupStart / ncclGroupEnd pair as single-process NCCL requires.
//
// Timing: per sample, an event on every rank's stream before and after `calls` all-reduces; the
// sample is the slowest rank's elapsed time over `calls`; the point is the median of the samples.
// NVLink multicast (NVLS) stays off: the caller's environment must keep NCCL_NVLS_ENABLE=0, and
// this file sets it when unset.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/comm.h"
#include "backends/cuda/nccl.cuh"
#include "backends/cuda/cuda_launch.cuh"
#include "opforge/error.h"

namespace opforge {

namespace {

namespace nccl = cuda::nccl;
constexpr int kNcclSum = nccl::kSum;
void nccl_check(int r, const char* what) { nccl::check_result(r, what); }
int nccl_dtype(DType t) { return nccl::dtype_code(t, "all_reduce"); }

// Host bits of a small integer in dtype t (exact in every supported dtype for the check).
std::vector<unsigned char> filled_bytes(DType t, int64_t count, float value) {
  std::vector<unsigned char> out(size_t(count * dtype_size(t)));
  for (int64_t i = 0; i < count; ++i) store_from_double(out.data(), t, i, value);
  return out;
}

// One communicator per GPU 0..tp-1, with a buffer and a stream each; released on scope exit.
class Ring {
 public:
  Ring(int tp, int64_t max_bytes) : comms_(size_t(tp)), streams_(size_t(tp)), buffers_(size_t(tp)) {
    std::vector<int> devices(static_cast<size_t>(tp));
    for (int r = 0; r < tp; ++r) devices[size_t(r)] = r;
    nccl_check(nccl::api().comm_init_all(comms_.data(), tp, devices.data()), "ncclCommInitAll");
    for (int r = 0; r < tp; ++r) {
      cuda::DeviceGuard guard(r);
      OPFORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[size_t(r)], cudaStreamNonBlocking));
      OPFORGE_CUDA_CHECK(cudaMalloc(&buffers_[size_t(r)], size_t(std::max<int64_t>(max_bytes, 16))));
    }
  }
  ~Ring() {
    for (size_t r = 0; r < comms_.size(); ++r) {
      cudaSetDevice(int(r));
      if (streams_[r]) cudaStreamSynchronize(streams_[r]);
      if (buffers_[r]) cudaFree(buffers_[r]);
      if (streams_[r]) cudaStreamDestroy(streams_[r]);
      if (comms_[r]) nccl::api().comm_destroy(comms_[r]);
    }
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  int tp() const { return int(comms_.size()); }
  void* buffer(int r) const { return buffers_[size_t(r)]; }
  cudaStream_t stream(int r) const { return streams_[size_t(r)]; }

  // One in-place all-reduce of `count` elements on every rank.
  void all_reduce(int64_t count, int dtype) {
    nccl_check(nccl::api().group_start(), "ncclGroupStart");
    for (int r = 0; r < tp(); ++r)
      nccl_check(nccl::api().all_reduce(buffers_[size_t(r)], buffers_[size_t(r)], size_t(count), dtype, kNcclSum,
                                   comms_[size_t(r)], streams_[size_t(r)]),
                 "ncclAllReduce");
    nccl_check(nccl::api().group_end(), "ncclGroupEnd");
  }
  void synchronize() {
    for (int r = 0; r < tp(); ++r) {
      cuda::DeviceGuard guard(r);
      OPFORGE_CUDA_CHECK(cudaStreamSynchronize(streams_[size_t(r)]));
    }
  }

 private:
  std::vector<nccl::Comm> comms_;
  std::vector<cudaStream_t> streams_;
  std::vector<void*> buffers_;
};

// Elements of the sum check: odd, not a multiple of any vector width.
constexpr int64_t kCheckCount = 4099;

// Rank r holds r + 1 in every element; after the all-reduce every rank must hold tp (tp + 1) / 2.
void check_sum(Ring& ring, DType t) {
  const int64_t count = kCheckCount;
  const int tp = ring.tp();
  for (int r = 0; r < tp; ++r) {
    cuda::DeviceGuard guard(r);
    auto bytes = filled_bytes(t, count, float(r + 1));
    OPFORGE_CUDA_CHECK(cudaMemcpy(ring.buffer(r), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  ring.all_reduce(count, nccl_dtype(t));
  ring.synchronize();
  const double want = double(tp) * (tp + 1) / 2;
  std::vector<unsigned char> host(size_t(count * dtype_size(t)));
  for (int r = 0; r < tp; ++r) {
    cuda::DeviceGuard guard(r);
    OPFORGE_CUDA_CHECK(cudaMemcpy(host.data(), ring.buffer(r), host.size(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < count; ++i) {
      double got = load_as_double(host.data(), t, i);
      if (got != want)
        throw Error(ErrorCode::backend, "all_reduce check: rank " + std::to_string(r) + " element " +
                                            std::to_string(i) + " holds " + std::to_string(got) +
                                            ", expected " + std::to_string(want));
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

double time_point_us(Ring& ring, int64_t count, int dtype, int samples, int calls) {
  const int tp = ring.tp();
  std::vector<cudaEvent_t> start(static_cast<size_t>(tp)), stop(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    cuda::DeviceGuard guard(r);
    OPFORGE_CUDA_CHECK(cudaEventCreate(&start[size_t(r)]));
    OPFORGE_CUDA_CHECK(cudaEventCreate(&stop[size_t(r)]));
  }
  for (int i = 0; i < 3; ++i) ring.all_reduce(count, dtype);  // warm-up
  std::vector<double> per_call;
  for (int s = 0; s < samples; ++s) {
    for (int r = 0; r < tp; ++r) {
      cuda::DeviceGuard guard(r);
      OPFORGE_CUDA_CHECK(cudaEventRecord(start[size_t(r)], ring.stream(r)));
    }
    for (int c = 0; c < calls; ++c) ring.all_reduce(count, dtype);
    double slowest = 0;
    for (int r = 0; r < tp; ++r) {
      cuda::DeviceGuard guard(r);
      OPFORGE_CUDA_CHECK(cudaEventRecord(stop[size_t(r)], ring.stream(r)));
    }
    for (int r = 0; r < tp; ++r) {
      cuda::DeviceGuard guard(r);
      OPFORGE_CUDA_CHECK(cudaEventSynchronize(stop[size_t(r)]));
      float ms = 0;
      OPFORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, start[size_t(r)], stop[size_t(r)]));
      slowest = std::max(slowest, double(ms));
    }
    per_call.push_back(slowest * 1e3 / calls);
  }
  for (int r = 0; r < tp; ++r) {
    cuda::DeviceGuard guard(r);
    cudaEventDestroy(start[size_t(r)]);
    cudaEventDestroy(stop[size_t(r)]);
  }
  return median(per_call);
}

}  // namespace

int comm_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string nccl_describe() { return nccl::describe(); }

std::vector<AllReducePoint> measure_nccl_all_reduce(const AllReduceSetup& setup) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // never NVLink multicast (see the file comment)
  const nccl::Api& n = nccl::api();
  if (!n.error.empty()) throw Error(ErrorCode::not_available, "all_reduce: " + n.error);
  const int gpus = comm_device_count();
  const int dtype = nccl_dtype(setup.dtype);
  const int64_t item = dtype_size(setup.dtype);
  int64_t max_bytes = 0;
  for (int64_t b : setup.bytes) {
    if (b <= 0 || b % item != 0)
      throw Error(ErrorCode::invalid_argument, "all_reduce: argument 'bytes': expected a positive multiple of " +
                                                   std::to_string(item) + ", got " + std::to_string(b));
    max_bytes = std::max(max_bytes, b);
  }
  std::vector<AllReducePoint> out;
  for (int tp : setup.tps) {
    if (tp < 2)
      throw Error(ErrorCode::invalid_argument, "all_reduce: argument 'tp': expected >= 2, got " + std::to_string(tp));
    if (tp > gpus) continue;
    Ring ring(tp, std::max(max_bytes, kCheckCount * item));  // the check's buffer may be the larger
    check_sum(ring, setup.dtype);
    for (int64_t bytes : setup.bytes) {
      AllReducePoint p;
      p.tp = tp;
      p.bytes = bytes;
      p.median_us = time_point_us(ring, bytes / item, dtype, std::max(setup.samples, 1), std::max(setup.calls, 1));
      p.bus_gbps = p.median_us > 0 ? 2.0 * (tp - 1) / tp * double(bytes) / (p.median_us * 1e-6) / 1e9 : 0;
      out.push_back(p);
    }
  }
  if (out.empty())
    throw Error(ErrorCode::not_available, "all_reduce: " + std::to_string(gpus) +
                                              " GPU(s) visible; every requested tp needs more");
  return out;
}

}  // namespace opforge
