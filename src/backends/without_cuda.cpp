// Built instead of the CUDA backend when nvcc was not found (or OPFORGE_CUDA=OFF): every op that has
// CUDA kernels (src/backends/cuda_ops.h) gets a "cuda" entry that is never available, so
// `opforge list` says why those kernels are missing.
#include "backends/comm.h"
#include "backends/cuda_ops.h"
#include "opforge/error.h"
#include "opforge/registry.h"

namespace opforge {

void register_cuda_placeholders(Registry& reg) {
  for (std::string_view op : kOpsWithCudaKernels)
    reg.add_unavailable(op, KernelDesc{"cuda", DeviceKind::cuda, 100}, OPFORGE_CUDA_MISSING_REASON);
}

int comm_device_count() { return 0; }

std::string nccl_describe() { return OPFORGE_CUDA_MISSING_REASON; }

std::vector<AllReducePoint> measure_nccl_all_reduce(const AllReduceSetup&) {
  throw Error(ErrorCode::not_available, std::string("all_reduce: ") + OPFORGE_CUDA_MISSING_REASON);
}

}  // namespace opforge
