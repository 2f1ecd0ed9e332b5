// Built instead of the CUDA backend when nvcc was not found (or OPFORGE_CUDA=OFF): every op that has
// CUDA kernels (src/backends/cuda_ops.h) gets a "cuda" entry that is never available, so
// `opforge list` says why those kernels are missing.
#include "backends/cuda_ops.h"
#include "opforge/registry.h"

namespace opforge {

void register_cuda_placeholders(Registry& reg) {
  for (std::string_view op : kOpsWithCudaKernels)
    reg.add_unavailable(op, KernelDesc{"cuda", DeviceKind::cuda, 100}, OPFORGE_CUDA_MISSING_REASON);
}

}  // namespace opforge
