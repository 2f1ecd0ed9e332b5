// Slot<Op>: the typed handle a model holds for one op on one device.
//
//   auto slot = opforge::bind<RmsNorm>(policy, Device::cpu());
//   slot(y, x, w, 1e-6, 0.0);        // check, then the first applicable candidate
//   std::cout << slot.explain();     // why that kernel
//
// Cost of a call (Note [slot fast path]): Op::check, a device check per tensor argument, then
// either one indirect call (a single candidate without predicate) or a walk over the candidates'
// predicates. bench/dispatch_bench.cpp measures it against a direct call.
#pragma once

#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "opforge/error.h"
#include "opforge/registry.h"

namespace opforge {

namespace detail {
[[noreturn]] void throw_wrong_device(const OpEntry& op, size_t arg, const TensorView& t,
                                     Device expected);
[[noreturn]] void throw_no_candidate(const Decision& d, const std::string& reasons);
// Runs a CPU kernel for tensors on another device by copying them through the host.
void run_host_staged(const KernelEntry& k, const Context& ctx, std::span<const Value> args);
// Slow path shared by typed and boxed calls once the first candidate was rejected.
void note_fallback(const Decision& d, const KernelEntry& rejected, const char* why);
}  // namespace detail

template <class Op, class Sig = typename Op::Signature> class Slot;

template <class Op, class... A> class Slot<Op, void(A...)> {
 public:
  using Kernel = void(const Context&, A...);
  using Predicate = const char*(A...);

  Slot() = default;
  explicit Slot(Decision decision) : decision_(std::make_shared<Decision>(std::move(decision))) {
    ctx_.device = decision_->device;
    for (const Candidate& c : decision_->candidates) {
      typed_.push_back({reinterpret_cast<Kernel*>(c.kernel->fn),
                        reinterpret_cast<Predicate*>(c.kernel->predicate), &c});
    }
    // Note [slot fast path]: a first candidate without a predicate is always the one that runs,
    // whatever follows it, so the call skips the candidate walk.
    single_ = !typed_.empty() && typed_[0].pred == nullptr && !typed_[0].source->host_staged;
    first_ = typed_.empty() ? nullptr : typed_[0].fn;
  }

  bool bound() const { return decision_ != nullptr; }
  void set_stream(Stream s) { ctx_.stream = s; }
  Stream stream() const { return ctx_.stream; }
  Device device() const { return ctx_.device; }
  const Decision& decision() const { return *decision_; }
  std::string explain() const { return decision_->explain(); }
  // The kernel a call with these arguments would run (runs no kernel, runs the check).
  const KernelEntry& pick(A... a) const {
    Op::check(a...);
    return *typed_[index_for(a...)].source->kernel;
  }

  void operator()(A... a) const {
    Op::check(a...);
    check_devices(std::index_sequence_for<A...>{}, a...);
    if (single_) [[likely]] {
      first_(ctx_, a...);
      return;
    }
    const Typed& t = typed_[index_for(a...)];
    if (t.source->host_staged) {
      const Value boxed[] = {Value(box(a))...};
      detail::run_host_staged(*t.source->kernel, ctx_, boxed);
      return;
    }
    t.fn(ctx_, a...);
  }

 private:
  struct Typed {
    Kernel* fn;
    Predicate* pred;
    const Candidate* source;
  };

  static Value box(const TensorView& t) { return t.defined() ? Value(t) : Value(None{}); }
  static Value box(int64_t v) { return v; }
  static Value box(double v) { return v; }
  static Value box(bool v) { return v; }
  static Value box(std::string_view v) { return std::string(v); }

  template <size_t... I>
  void check_devices(std::index_sequence<I...>, A... a) const {
    (check_device(I, a), ...);
  }
  void check_device(size_t i, const TensorView& t) const {
    if (t.defined() && !(t.device == ctx_.device)) [[unlikely]]
      detail::throw_wrong_device(*decision_->op, i, t, ctx_.device);
  }
  template <class T> void check_device(size_t, const T&) const {}

  size_t index_for(A... a) const {
    const Typed& first = typed_[0];
    if (!first.pred || !first.pred(a...)) [[likely]] return 0;
    return index_after_rejection(a...);
  }

  // Slow path: the first candidate rejected the arguments.
  size_t index_after_rejection(A... a) const {
    std::string reasons;
    for (size_t i = 0; i < typed_.size(); ++i) {
      const Typed& t = typed_[i];
      const char* why = t.pred ? t.pred(a...) : nullptr;
      if (!why) return i;
      // strict: a forced kernel that rejects the arguments is an error, not a fallback.
      if (decision_->mode == PolicyMode::strict && t.source->forced)
        detail::throw_no_candidate(*decision_, t.source->kernel->impl() + ": " + why);
      detail::note_fallback(*decision_, *t.source->kernel, why);
      reasons += t.source->kernel->impl() + ": " + why + "; ";
    }
    detail::throw_no_candidate(*decision_, reasons);
  }

  std::shared_ptr<const Decision> decision_;
  std::vector<Typed> typed_;
  Kernel* first_ = nullptr;
  bool single_ = false;
  Context ctx_{};
};

// Bind an op of `registry` for `device` under `policy` (validated against the registry).
template <class Op>
Slot<Op> bind(const Registry& registry, const Policy& policy, Device device) {
  policy.validate(registry);
  return Slot<Op>(registry.decide(registry.op(Op::name), policy, device));
}
template <class Op> Slot<Op> bind(const Policy& policy, Device device) {
  return bind<Op>(global_registry(), policy, device);
}

// ---- process-wide default slots (the plain function API) ---------------------------------
// The default policy comes from Policy::from_sources() (config file, OPFORGE_OPS) until
// set_default_policy() replaces it; replacing it rebinds every default slot on next use.
void set_default_policy(const Policy& policy);
Policy default_policy();
uint64_t default_policy_generation();

namespace detail {
inline Device device_of_first_tensor() { return Device::cpu(); }
template <class T, class... R> Device device_of_first_tensor(const T& t, const R&... rest) {
  if constexpr (std::is_same_v<T, TensorView> || std::is_same_v<T, Tensor>) {
    const TensorView& v = t;
    if (v.defined()) return v.device;
  }
  return device_of_first_tensor(rest...);
}
std::mutex& default_slot_mutex();
}  // namespace detail

template <class Op> const Slot<Op>& default_slot(Device device) {
  constexpr int kMaxCudaDevices = 16;
  struct Entry {
    std::atomic<uint64_t> generation{0};  // 0: never bound
    std::unique_ptr<Slot<Op>> slot;
  };
  static Entry entries[1 + kMaxCudaDevices];
  int index = device.is_cpu() ? 0 : 1 + device.index;
  if (index < 0 || index > kMaxCudaDevices)
    throw Error(ErrorCode::invalid_argument, std::string(Op::name) + ": device " + device.str() +
                                                 " is beyond the supported ordinals");
  Entry& e = entries[index];
  uint64_t want = default_policy_generation();
  if (e.generation.load(std::memory_order_acquire) != want) [[unlikely]] {
    std::lock_guard<std::mutex> lock(detail::default_slot_mutex());
    if (e.generation.load(std::memory_order_relaxed) != want) {
      // A caller may still hold a reference to the old slot: retire it, never free it.
      static std::vector<std::unique_ptr<Slot<Op>>> retired;
      if (e.slot) retired.push_back(std::move(e.slot));
      e.slot = std::make_unique<Slot<Op>>(bind<Op>(default_policy(), device));
      e.generation.store(want, std::memory_order_release);
    }
  }
  return *e.slot;
}

// Plain call through the default slot of the device of the first tensor argument.
template <class Op, class... A> void call(const A&... args) {
  default_slot<Op>(detail::device_of_first_tensor(args...))(args...);
}

}  // namespace opforge
