// The NCCL all-reduce measurement (src/backends/comm.h): on a machine with fewer than two GPUs (or
// without CUDA or NCCL) it refuses with a reason instead of crashing; with two or more it checks
// the sum before timing and returns one point per (tp, bytes).
#include <gtest/gtest.h>

#include <string>

#include "backends/comm.h"
#include "opforge/error.h"

namespace opforge {
namespace {

TEST(Comm, AllReduceNeedsTwoGpusAndSaysWhy) {
  AllReduceSetup setup;
  setup.tps = {2};
  setup.bytes = {4096};
  setup.samples = 2;
  setup.calls = 2;
  if (comm_device_count() >= 2 && nccl_describe().rfind("NCCL ", 0) == 0) {
    const auto points = measure_nccl_all_reduce(setup);
    ASSERT_EQ(points.size(), 1u);
    EXPECT_EQ(points[0].tp, 2);
    EXPECT_GT(points[0].median_us, 0);
    return;
  }
  try {
    measure_nccl_all_reduce(setup);
    ADD_FAILURE() << "expected not_available";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::not_available) << e.what();
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
  }
}

TEST(Comm, DescribesNcclOrWhyNot) { EXPECT_FALSE(nccl_describe().empty()); }

}  // namespace
}  // namespace opforge
