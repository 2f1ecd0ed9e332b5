// Negative compile test (ctest: compile_fail.wrong_kernel_signature).
//
// Registry::add_kernel<Op> static_asserts that the kernel's function type is exactly
// OpTraits<Op>::Kernel. Here the op's signature says `double factor` but the kernel was written
// against an older signature with `float factor`: this file must NOT compile, and the compiler
// must say "kernel function type differs from the op's signature".
//
// Control (ctest: compile_fail.control_compiles): with -DOPFORGE_COMPILE_FAIL_CONTROL the kernel
// has the right type and the file must compile, so the negative test cannot pass because of an
// unrelated error (a missing include, a renamed API).
#include "opforge/registry.h"

namespace {

using opforge::ArgRole;
using opforge::Context;
using opforge::TensorView;

struct Scale {
  static constexpr const char* name = "scale";
  using Signature = void(const TensorView& y, const TensorView& x, double factor);
  static constexpr opforge::ArgSpec args[] = {
      {"y", ArgRole::out}, {"x", ArgRole::in}, {"factor", ArgRole::scalar, "1"}};
  static constexpr const char* doc = "y = x * factor";
  static void check(const TensorView&, const TensorView&, double) {}
};

#ifdef OPFORGE_COMPILE_FAIL_CONTROL
void scale_reference(const Context&, const TensorView&, const TensorView&, double) {}
#else
void scale_reference(const Context&, const TensorView&, const TensorView&, float) {}
#endif

}  // namespace

void register_scale(opforge::Registry& registry) {
  registry.add_op<Scale>();
  registry.add_kernel<Scale>(
      opforge::KernelDesc{"reference", opforge::DeviceKind::cpu, opforge::kReferencePriority},
      &scale_reference);
}
