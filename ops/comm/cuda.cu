// all_reduce through NCCL, one rank per GPU (comm_cuda.h; Note [stacked ranks] in comm.h).
//
// Placement: rank 0 is the caller's GPU d and reads x[0] / writes y[0] where they are; rank r > 0
// runs on GPU (d + r) mod n with a buffer of its own there. One call, on the caller's stream s:
//   1. an event on s; each peer rank's stream waits for it and copies x[r] to its GPU
//      (cudaMemcpyPeerAsync: a peer copy over NVLink / PCIe, staged by the driver without peer access);
//   2. every rank's ncclAllReduce inside one ncclGroupStart / ncclGroupEnd, as single-process NCCL
//      requires: rank 0 out of place x[0] -> y[0] on s, the others in place on their own streams;
//   3. each peer copies its result into y[r] and records an event that s waits for.
// The call is thus ordered on s like any kernel, nothing synchronizes with the host, and a graph
// capture of s takes the peer streams along (fork and join through events). The staging copies of
// steps 1 and 3 exist only because of the stacked layout: a tensor-parallel model's buffers already
// live on their GPUs, and `opforge collect-comm` times the collective alone for the estimator.
//
// A group (communicators, streams, events, peer buffers) is made at the first call for a (device,
// ranks) pair and kept for the process; a peer buffer grows (cudaMalloc) only when a call needs more
// than any call before it, which the harness's first, uncaptured call takes care of. NVLink
// multicast stays off (NCCL_NVLS_ENABLE=0 unless the environment says otherwise).
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/comm.h"
#include "backends/cuda/cuda_launch.cuh"
#include "backends/cuda/nccl.cuh"
#include "ops/comm/comm_cuda.h"

namespace opforge {

namespace {

namespace nccl = cuda::nccl;
using TV = TensorView;

// GPUs of this process (backends/comm.h), asked once: the predicate runs on every call.
int visible_gpus() {
  static const int n = comm_device_count();
  return n;
}

class Group {
 public:
  Group(int device, int ranks) : devices_(size_t(ranks)), comms_(size_t(ranks)), peers_(size_t(ranks)) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const int n = visible_gpus();
    for (int r = 0; r < ranks; ++r) devices_[size_t(r)] = (device + r) % n;
    nccl::check_result(nccl::api().comm_init_all(comms_.data(), ranks, devices_.data()), "all_reduce: ncclCommInitAll");
    cuda::DeviceGuard guard(device);
    OPFORGE_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    for (int r = 1; r < ranks; ++r) {
      Peer& p = peers_[size_t(r)];
      cuda::DeviceGuard on_peer(devices_[size_t(r)]);
      OPFORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
      OPFORGE_CUDA_CHECK(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming));
    }
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  // Kept for the process: NCCL's own teardown at exit is not ordered with static destructors.

  std::mutex mutex;

  // Every peer buffer holds at least `bytes`.
  void reserve(size_t bytes) {
    for (size_t r = 1; r < peers_.size(); ++r) {
      Peer& p = peers_[r];
      if (p.bytes >= bytes) continue;
      cuda::DeviceGuard on_peer(devices_[r]);
      OPFORGE_CUDA_CHECK(cudaStreamSynchronize(p.stream));
      if (p.buffer) OPFORGE_CUDA_CHECK(cudaFree(p.buffer));
      p.buffer = nullptr;
      p.bytes = 0;
      OPFORGE_CUDA_CHECK(cudaMalloc(&p.buffer, bytes));
      p.bytes = bytes;
    }
  }

  void run(cudaStream_t s, const char* x, char* y, int64_t count, int dtype, size_t bytes) {
    const int ranks = int(devices_.size());
    const int d = devices_[0];
    cuda::DeviceGuard guard(d);
    OPFORGE_CUDA_CHECK(cudaEventRecord(ready_, s));
    for (int r = 1; r < ranks; ++r) {
      Peer& p = peers_[size_t(r)];
      cuda::DeviceGuard on_peer(devices_[size_t(r)]);
      OPFORGE_CUDA_CHECK(cudaStreamWaitEvent(p.stream, ready_, 0));
      OPFORGE_CUDA_CHECK(cudaMemcpyPeerAsync(p.buffer, devices_[size_t(r)], x + size_t(r) * bytes, d, bytes, p.stream));
    }
    nccl::check_result(nccl::api().group_start(), "all_reduce: ncclGroupStart");
    for (int r = 0; r < ranks; ++r) {
      const Peer& p = peers_[size_t(r)];
      const void* send = r == 0 ? static_cast<const void*>(x) : p.buffer;
      void* recv = r == 0 ? static_cast<void*>(y) : p.buffer;
      nccl::check_result(nccl::api().all_reduce(send, recv, size_t(count), dtype, nccl::kSum, comms_[size_t(r)],
                                                r == 0 ? s : p.stream),
                         "all_reduce: ncclAllReduce");
    }
    nccl::check_result(nccl::api().group_end(), "all_reduce: ncclGroupEnd");
    for (int r = 1; r < ranks; ++r) {
      Peer& p = peers_[size_t(r)];
      {
        cuda::DeviceGuard on_peer(devices_[size_t(r)]);
        OPFORGE_CUDA_CHECK(cudaMemcpyPeerAsync(y + size_t(r) * bytes, d, p.buffer, devices_[size_t(r)], bytes, p.stream));
        OPFORGE_CUDA_CHECK(cudaEventRecord(p.done, p.stream));
      }
      OPFORGE_CUDA_CHECK(cudaStreamWaitEvent(s, p.done, 0));
    }
  }

 private:
  struct Peer {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    void* buffer = nullptr;
    size_t bytes = 0;
  };
  std::vector<int> devices_;
  std::vector<nccl::Comm> comms_;
  std::vector<Peer> peers_;  // [0] unused: rank 0 works on x and y
  cudaEvent_t ready_ = nullptr;
};

Group& group_for(int device, int ranks) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, std::unique_ptr<Group>>* groups =
      new std::map<std::pair<int, int>, std::unique_ptr<Group>>();  // never destroyed (see Group)
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Group>& g = (*groups)[{device, ranks}];
  if (!g) g = std::make_unique<Group>(device, ranks);
  return *g;
}

}  // namespace

const char* all_reduce_nccl_applicable(const TV& y, const TV& x) {
  (void)y;
  if (!cuda::is_cuda_float(x.dtype)) return cuda::kNotCudaFloat;
  if (!nccl::api().error.empty()) return nccl::api().error.c_str();  // a process-lifetime string
  if (x.size(0) > visible_gpus()) return "more ranks than visible GPUs (one GPU per rank)";
  return nullptr;
}

void all_reduce_nccl(const Context& ctx, const TV& y, const TV& x) {
  const int64_t ranks = x.size(0);
  const int64_t count = x.numel() / ranks;
  if (count == 0) return;
  const size_t bytes = size_t(count) * size_t(x.itemsize());
  Group& g = group_for(ctx.device.index, int(ranks));
  std::lock_guard<std::mutex> lock(g.mutex);
  g.reserve(bytes);
  g.run(cuda::stream_of(ctx), static_cast<const char*>(x.data), static_cast<char*>(y.data), count,
        nccl::dtype_code(x.dtype, AllReduce::name), bytes);
}

void register_comm_cuda(Registry& reg) {
  reg.add_kernel<AllReduce>(
      cuda_kernel_desc("nccl", 100, "NCCL all-reduce, one rank per GPU; stacked rows staged by peer copies", false),
      &all_reduce_nccl, &all_reduce_nccl_applicable);
}

}  // namespace opforge
