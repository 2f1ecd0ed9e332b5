// Dispatched bulk conversions (see convert.h). One vector per step; the tail goes through
// load_n / store_n like the kernels' row tails, so this exercises exactly the kernels' code.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/cpu/convert.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "backends/cpu/convert.h"
#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::cpu::HWY_NAMESPACE {

template <class From, class To> void convert_n(const From* src, To* dst, int64_t n) {
  for_each_vector(n, [&](int64_t i, size_t count) { store_n(load_n(src + i, count), dst + i, count); });
}

void f32_to_bf16_impl(const float* src, uint16_t* dst, int64_t n) {
  convert_n(src, reinterpret_cast<bf16_t*>(dst), n);
}
void f32_to_f16_impl(const float* src, uint16_t* dst, int64_t n) {
  convert_n(src, reinterpret_cast<f16_t*>(dst), n);
}
void bf16_to_f32_impl(const uint16_t* src, float* dst, int64_t n) {
  convert_n(reinterpret_cast<const bf16_t*>(src), dst, n);
}
void f16_to_f32_impl(const uint16_t* src, float* dst, int64_t n) {
  convert_n(reinterpret_cast<const f16_t*>(src), dst, n);
}

}  // namespace opforge::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::cpu {

HWY_EXPORT(f32_to_bf16_impl);
HWY_EXPORT(f32_to_f16_impl);
HWY_EXPORT(bf16_to_f32_impl);
HWY_EXPORT(f16_to_f32_impl);

void f32_to_bf16_n(const float* src, uint16_t* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(f32_to_bf16_impl)(src, dst, n);
}
void f32_to_f16_n(const float* src, uint16_t* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(f32_to_f16_impl)(src, dst, n);
}
void bf16_to_f32_n(const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(bf16_to_f32_impl)(src, dst, n);
}
void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(f16_to_f32_impl)(src, dst, n);
}

std::vector<SimdTarget> simd_targets() {
  std::vector<SimdTarget> out;
  for (int64_t bit : hwy::SupportedAndGeneratedTargets()) out.push_back({bit, hwy::TargetName(bit)});
  return out;
}

std::string simd_target_name() {
  // The best supported target among those compiled is the one dispatch uses.
  const int64_t usable = hwy::SupportedTargets() & HWY_TARGETS;
  if (usable == 0) return hwy::TargetName(HWY_STATIC_TARGET);
  return hwy::TargetName(usable & -usable);
}

void restrict_simd_target_for_testing(int64_t bit) { hwy::SetSupportedTargetsForTest(bit); }

}  // namespace opforge::cpu
#endif  // HWY_ONCE
