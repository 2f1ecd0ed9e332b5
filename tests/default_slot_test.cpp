// The plain function API: a process-wide default slot per (op, device), rebound when the default
// policy changes; and slots on the real registry.
#include <gtest/gtest.h>

#include <cmath>

#include "opforge/error.h"
#include "opforge/slot.h"
#include "ops/norm/norm.h"

namespace {

using namespace opforge;

struct Rows {
  Tensor x = Tensor::empty(Shape{3, 40}, DType::f32);
  Tensor w = Tensor::empty(Shape{40}, DType::f32);
  Tensor y = Tensor::zeros(Shape{3, 40}, DType::f32);
  Rows() {
    for (int i = 0; i < 120; ++i) x.ptr<float>()[i] = float((i * 37) % 11) - 5.0f;
    for (int i = 0; i < 40; ++i) w.ptr<float>()[i] = 0.5f + 0.01f * float(i);
  }
  double expected(int row, int col) const {
    double ss = 0;
    for (int i = 0; i < 40; ++i) ss += double(x.ptr<float>()[row * 40 + i]) * x.ptr<float>()[row * 40 + i];
    return x.ptr<float>()[row * 40 + col] / std::sqrt(ss / 40 + 1e-6) * w.ptr<float>()[col];
  }
};

TEST(DefaultSlot, PlainCallUsesThePolicyAndRebindsWhenItChanges) {
  Rows r;
  set_default_policy(Policy::parse("all", "test"));
  call<RmsNorm>(r.y, r.x, r.w, 1e-6, 0.0);
  EXPECT_NEAR(r.y.ptr<float>()[45], r.expected(1, 5), 1e-5);
  EXPECT_EQ(default_slot<RmsNorm>(Device::cpu()).decision().candidates.front().kernel->impl(), "cpu");

  set_default_policy(Policy::parse("-rms_norm", "test"));
  EXPECT_EQ(default_slot<RmsNorm>(Device::cpu()).decision().candidates.front().kernel->impl(), "reference");
  call<RmsNorm>(r.y, r.x, r.w, 1e-6, 0.0);
  EXPECT_NEAR(r.y.ptr<float>()[119], r.expected(2, 39), 1e-5);

  EXPECT_THROW(set_default_policy(Policy::parse("-rms_nrom", "test")), Error);
  set_default_policy(Policy::parse("all", "test"));
}

TEST(DefaultSlot, BadArgumentsWriteNothing) {
  Rows r;
  Tensor short_w = Tensor::zeros(Shape{39}, DType::f32);
  EXPECT_THROW(call<RmsNorm>(r.y, r.x, short_w, 1e-6, 0.0), Error);
  for (int i = 0; i < 120; ++i) ASSERT_EQ(r.y.ptr<float>()[i], 0.0f);
}

TEST(Slot, TwoSlotsOfOneProcessBindDifferently) {
  Rows r;
  auto fast = bind<RmsNorm>(Policy::parse("all", "model A"), Device::cpu());
  auto ref = bind<RmsNorm>(Policy::parse("none", "model B"), Device::cpu());
  EXPECT_EQ(fast.pick(r.y, r.x, r.w, 1e-6, 0.0).impl(), "cpu");
  EXPECT_EQ(ref.pick(r.y, r.x, r.w, 1e-6, 0.0).impl(), "reference");
  EXPECT_NE(ref.explain().find("rule: 'none' (from model B)"), std::string::npos) << ref.explain();
  Tensor y2 = Tensor::zeros(Shape{3, 40}, DType::f32);
  fast(r.y, r.x, r.w, 1e-6, 0.0);
  ref(y2, r.x, r.w, 1e-6, 0.0);
  for (int i = 0; i < 120; ++i) EXPECT_NEAR(r.y.ptr<float>()[i], y2.ptr<float>()[i], 1e-5);
}

TEST(Slot, CudaSlotWithoutCudaSaysWhy) {
#ifndef OPFORGE_WITH_CUDA
  try {
    bind<RmsNorm>(Policy::parse("rms_norm=cuda,strict"), Device::cuda(0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
#else
  GTEST_SKIP() << "built with CUDA: covered by cuda_kernels_test";
#endif
}

}  // namespace
