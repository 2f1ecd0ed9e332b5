// src/backends/cuda_ops.h lists the ops with CUDA kernels. In a CUDA build (GPU or not) exactly those
// ops register CUDA kernels; in a build without CUDA exactly those ops show a `cuda` entry, never
// available, whose reason says CUDA was not built.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "backends/cuda_ops.h"
#include "opforge/registry.h"

namespace opforge {
namespace {

TEST(CudaRegistration, OpsWithCudaEntriesMatchTheList) {
  std::set<std::string> listed(std::begin(kOpsWithCudaKernels), std::end(kOpsWithCudaKernels));
  std::set<std::string> registered;
  for (const OpEntry* op : global_registry().ops())
    for (const KernelEntry& k : op->kernels)
      if (k.desc.device == DeviceKind::cuda) {
        registered.insert(op->name);
#ifndef OPFORGE_WITH_CUDA
        EXPECT_FALSE(k.availability().ok) << op->name;
        EXPECT_NE(k.availability().reason.find("without CUDA"), std::string::npos) << k.availability().reason;
#endif
      }
  EXPECT_EQ(registered, listed);
}

}  // namespace
}  // namespace opforge
