// A toy op for testing the registry, slots and harness in isolation: y = 2 * x (f32, any shape),
// with a reference, a correct cpu kernel, and kernels with planted faults.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "opforge/checks.h"
#include "opforge/error.h"
#include "opforge/registry.h"
#include "opforge/slot.h"

namespace toy {

using opforge::ArgRole;
using opforge::ArgSpec;
using opforge::Context;
using opforge::TensorView;

struct Scale2 {
  static constexpr const char* name = "scale2";
  using Signature = void(const TensorView& y, const TensorView& x);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out}, {"x", ArgRole::in}};
  static constexpr const char* doc = "y = 2 x";
  static void check(const TensorView& y, const TensorView& x) {
    if (!(y.shape_of() == x.shape_of()))
      opforge::throw_argument_error(name, "y", "shape " + x.shape_of().str(), y.shape_of().str());
  }
};

inline int64_t n_of(const TensorView& t) { return t.numel(); }
inline double get(const TensorView& t, int64_t i) { return opforge::load_as_double(t.data, t.dtype, i); }
inline void put(const TensorView& t, int64_t i, double v) { opforge::store_from_double(t.data, t.dtype, i, v); }

inline void scale2_reference(const Context&, const TensorView& y, const TensorView& x) {
  for (int64_t i = 0; i < n_of(x); ++i) put(y, i, 2 * get(x, i));
}
inline void scale2_good(const Context&, const TensorView& y, const TensorView& x) {
  for (int64_t i = 0; i < n_of(x); ++i) put(y, i, 2 * get(x, i));
}
// Wrong by a small amount: 2x * (1 + 1e-3), well past f32 tolerance.
inline void scale2_slightly_wrong(const Context&, const TensorView& y, const TensorView& x) {
  for (int64_t i = 0; i < n_of(x); ++i) put(y, i, 2 * get(x, i) * 1.001);
}
// Leaves the last element unwritten.
inline void scale2_unwritten(const Context&, const TensorView& y, const TensorView& x) {
  for (int64_t i = 0; i + 1 < n_of(x); ++i) put(y, i, 2 * get(x, i));
}
// Writes one element past the end.
inline void scale2_out_of_bounds(const Context&, const TensorView& y, const TensorView& x) {
  for (int64_t i = 0; i < n_of(x); ++i) put(y, i, 2 * get(x, i));
  put(y, n_of(x), 0.0);
}
// Writes its input.
inline void scale2_writes_input(const Context&, const TensorView& y, const TensorView& x) {
  for (int64_t i = 0; i < n_of(x); ++i) put(y, i, 2 * get(x, i));
  if (n_of(x) > 0) put(x, 0, 1.0);
}
// Right on every declared case (at most 32 elements), wrong (as scale2_slightly_wrong) past 40:
// what only shapes nobody wrote down catch (check --fuzz).
inline void scale2_wrong_past_40(const Context&, const TensorView& y, const TensorView& x) {
  for (int64_t i = 0; i < n_of(x); ++i) put(y, i, 2 * get(x, i) * (n_of(x) > 40 ? 1.001 : 1.0));
}
// A reference with a size limit its op's check does not have: more than 40 elements is an
// opforge::Error (the fuzz tests' invalid draws).
inline void throw_past_40(const TensorView& x) {
  if (n_of(x) > 40)
    throw opforge::Error(opforge::ErrorCode::invalid_argument, "scale2: argument 'x': expected at most 40 elements");
}
inline void scale2_reference_upto_40(const Context&, const TensorView& y, const TensorView& x) {
  throw_past_40(x);
  scale2_reference({}, y, x);
}
// Writes y[0] before it rejects the draw.
inline void scale2_writes_then_rejects(const Context&, const TensorView& y, const TensorView& x) {
  if (n_of(x) > 0) put(y, 0, 1.0);
  throw_past_40(x);
  scale2_reference({}, y, x);
}
// Applicable only when the size is even.
inline const char* even_only(const TensorView&, const TensorView& x) {
  return n_of(x) % 2 == 0 ? nullptr : "numel % 2 != 0";
}

inline std::vector<opforge::Case> scale2_cases() {
  using namespace opforge;
  return {Case{"4x8", CaseGroup::small, {{"x", TensorInit{Shape{4, 8}}}}},
          Case{"3x5", CaseGroup::edge, {{"x", TensorInit{Shape{3, 5}}}}},
          Case{"0x5", CaseGroup::edge, {{"x", TensorInit{Shape{0, 5}}}}}};
}

// Registers scale2 with its reference and the kernel `fn` under impl `impl`.
template <class F>
void add_scale2(opforge::Registry& reg, const std::string& impl, F* fn,
                opforge::OpTraits<Scale2>::Predicate* pred = nullptr, int priority = 100,
                opforge::OpTraits<Scale2>::Kernel* reference = &scale2_reference) {
  using namespace opforge;
  if (!reg.find("scale2")) {
    OpEntry& e = reg.add_op<Scale2>();
    e.outputs = [](const ArgList& a) {
      const TensorView& x = a.tensor("x");
      return std::vector<OutputSpec>{{"y", x.shape_of(), x.dtype}};
    };
    e.cost = [](const ArgList& a) { return Cost{double(a.tensor("x").numel()) * 8, double(a.tensor("x").numel())}; };
    e.cases = scale2_cases;
    reg.add_kernel<Scale2>(KernelDesc{"reference", DeviceKind::cpu, kReferencePriority, "", {}, {DType::f32, DType::f64}},
                           reference);
  }
  reg.add_kernel<Scale2>(KernelDesc{impl, DeviceKind::cpu, priority, "", {}, {DType::f32}}, fn, pred);
}

}  // namespace toy
