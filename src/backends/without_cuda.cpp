// Built instead of the CUDA backend when nvcc was not found (or OPFORGE_CUDA=OFF): every op gets a
// "cuda" entry that is never available, so `opforge list` says why CUDA kernels are missing.
#include "opforge/registry.h"

namespace opforge {

void register_cuda_placeholders(Registry& reg) {
  for (const OpEntry* op : reg.ops())
    reg.add_unavailable(op->name, KernelDesc{"cuda", DeviceKind::cuda, 100}, OPFORGE_CUDA_MISSING_REASON);
}

}  // namespace opforge
