// Dispatch overhead (Note [slot fast path] in include/opforge/slot.h): a kernel that does nothing,
// called directly through a function pointer, through a bound Slot, through a Slot whose kernel
// has an applicability predicate, and through the boxed call path the CLI and harness use.
// The ops live in a local Registry, so nothing here depends on the real op families.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <vector>

#include "opforge/error.h"
#include "opforge/policy.h"
#include "opforge/registry.h"
#include "opforge/slot.h"

namespace {

using opforge::Context;
using opforge::TensorView;

struct NoOp {
  static constexpr const char* name = "noop";
  using Signature = void(const TensorView& x);
  static constexpr opforge::ArgSpec args[] = {{"x", opforge::ArgRole::in}};
  static constexpr const char* doc = "Does nothing; measures the cost of dispatch.";
  static void check(const TensorView&) {}
};

// Same op shape, but its optimized kernel carries a predicate (every call evaluates it).
struct NoOpWithPredicate : NoOp {
  static constexpr const char* name = "noop_with_predicate";
};

__attribute__((noinline)) void noop_kernel(const Context&, const TensorView& x) {
  benchmark::DoNotOptimize(x.data);
}
__attribute__((noinline)) void noop_reference(const Context&, const TensorView& x) {
  benchmark::DoNotOptimize(x.data);
}
const char* accepts_contiguous(const TensorView& x) {
  return x.is_contiguous() ? nullptr : "x is not contiguous";
}

template <class Op> void register_noop(opforge::Registry& registry, bool with_predicate) {
  registry.add_op<Op>();
  registry.add_kernel<Op>(
      opforge::KernelDesc{"reference", opforge::DeviceKind::cpu, opforge::kReferencePriority},
      &noop_reference);
  registry.add_kernel<Op>(opforge::KernelDesc{"cpu", opforge::DeviceKind::cpu, 100}, &noop_kernel,
                          with_predicate ? &accepts_contiguous : nullptr);
}

opforge::Registry& bench_registry() {
  static opforge::Registry registry;
  static const bool registered = [] {
    register_noop<NoOp>(registry, false);
    register_noop<NoOpWithPredicate>(registry, true);
    return true;
  }();
  (void)registered;
  return registry;
}

float g_buffer[64];
TensorView bench_view() { return TensorView(g_buffer, opforge::DType::f32, {64}); }

template <class Op> void report_candidates(benchmark::State& state, const opforge::Slot<Op>& slot) {
  state.counters["candidates"] = double(slot.decision().candidates.size());
  state.SetLabel(slot.decision().candidates.front().kernel->impl());
}

void BM_DirectCall(benchmark::State& state) {
  const TensorView x = bench_view();
  const Context ctx{};
  void (*volatile fn)(const Context&, const TensorView&) = &noop_kernel;
  for (auto _ : state) {
    fn(ctx, x);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DirectCall);

void BM_SlotCall(benchmark::State& state) {
  const TensorView x = bench_view();
  auto slot = opforge::bind<NoOp>(bench_registry(), opforge::Policy::parse("all"),
                                  opforge::Device::cpu());
  for (auto _ : state) {
    slot(x);
    benchmark::ClobberMemory();
  }
  report_candidates(state, slot);
}
BENCHMARK(BM_SlotCall);

void BM_SlotCallWithPredicate(benchmark::State& state) {
  const TensorView x = bench_view();
  auto slot = opforge::bind<NoOpWithPredicate>(bench_registry(), opforge::Policy::parse("all"),
                                               opforge::Device::cpu());
  for (auto _ : state) {
    slot(x);
    benchmark::ClobberMemory();
  }
  report_candidates(state, slot);
}
BENCHMARK(BM_SlotCallWithPredicate);

// The by-name path of the CLI, harness and collector: boxed values, arity/type checks, the op's
// check, then the kernel.
void BM_BoxedCall(benchmark::State& state) {
  const opforge::Registry& registry = bench_registry();
  const opforge::Decision decision = registry.decide(
      registry.op(NoOp::name), opforge::Policy::parse("all"), opforge::Device::cpu());
  const std::vector<opforge::Value> args = {opforge::Value(bench_view())};
  for (auto _ : state) {
    registry.call(decision, args);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_BoxedCall);

}  // namespace

BENCHMARK_MAIN();
