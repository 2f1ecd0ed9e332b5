// Template parts of the registry: boxing generated from an op's typed signature.
// Included at the end of registry.h; not a public header of its own.
#pragma once

#include <type_traits>
#include <utility>

namespace opforge::detail {

// Note [boxed types]: Registry::call checks every Value against the op's ArgInfo before these run,
// so the std::get calls below cannot throw: f64 arguments accept an int, opt_in tensors accept None.
template <class T> struct Unbox;
template <> struct Unbox<const TensorView&> {
  static const TensorView& get(const Value& v) {
    static const TensorView none_view;
    if (const auto* t = std::get_if<TensorView>(&v)) return *t;
    return none_view;
  }
};
template <> struct Unbox<int64_t> {
  static int64_t get(const Value& v) { return std::get<int64_t>(v); }
};
template <> struct Unbox<double> {
  static double get(const Value& v) {
    if (const auto* i = std::get_if<int64_t>(&v)) return double(*i);
    return std::get<double>(v);
  }
};
template <> struct Unbox<bool> {
  static bool get(const Value& v) { return std::get<bool>(v); }
};
template <> struct Unbox<std::string_view> {
  static std::string_view get(const Value& v) { return std::get<std::string>(v); }
};

template <class Op, class Sig = typename Op::Signature> struct Boxer;
template <class Op, class... A> struct Boxer<Op, void(A...)> {
  using Kernel = void(const Context&, A...);
  using Predicate = const char*(A...);
  using Seq = std::index_sequence_for<A...>;

  static void call(AnyFn fn, const Context& ctx, std::span<const Value> v) {
    call_impl(reinterpret_cast<Kernel*>(fn), ctx, v, Seq{});
  }
  static const char* predicate(AnyFn pred, std::span<const Value> v) {
    return pred_impl(reinterpret_cast<Predicate*>(pred), v, Seq{});
  }
  static void check(std::span<const Value> v) { check_impl(v, Seq{}); }

 private:
  template <size_t... I>
  static void call_impl(Kernel* f, const Context& ctx, std::span<const Value> v,
                        std::index_sequence<I...>) {
    f(ctx, Unbox<A>::get(v[I])...);
  }
  template <size_t... I>
  static const char* pred_impl(Predicate* p, std::span<const Value> v, std::index_sequence<I...>) {
    return p(Unbox<A>::get(v[I])...);
  }
  template <size_t... I> static void check_impl(std::span<const Value> v, std::index_sequence<I...>) {
    Op::check(Unbox<A>::get(v[I])...);
  }
};

std::string format_signature(const OpEntry& op);
void finish_op(OpEntry& op);  // validates roles against types, fills the signature text
void check_new_kernel(const OpEntry& op, const KernelDesc& desc);  // rejects duplicates

}  // namespace opforge::detail

namespace opforge {

template <class Op> OpEntry& Registry::add_op() {
  using T = OpTraits<Op>;
  OpEntry& e = new_op(Op::name);
  e.doc = Op::doc;
  for (size_t i = 0; i < T::arity; ++i) {
    const ArgSpec& s = Op::args[i];
    ArgInfo a{s.name, s.role, T::types[i], s.default_value ? s.default_value : "",
              s.default_value != nullptr};
    e.args.push_back(std::move(a));
  }
  e.check_boxed = &detail::Boxer<Op>::check;
  if constexpr (requires { Op::backward; }) e.backward = Op::backward;
  detail::finish_op(e);
  return e;
}

template <class Op, class F>
KernelEntry& Registry::add_kernel(KernelDesc desc, F* fn,
                                  typename OpTraits<Op>::Predicate* predicate) {
  static_assert(std::is_same_v<F, typename OpTraits<Op>::Kernel>,
                "opforge: kernel function type differs from the op's signature "
                "(expected OpTraits<Op>::Kernel = void(const Context&, <Op::Signature params>))");
  OpEntry& e = const_cast<OpEntry&>(op(Op::name));
  detail::check_new_kernel(e, desc);
  KernelEntry& k = e.kernels.emplace_back();
  k.desc = std::move(desc);
  k.op = &e;
  k.fn = reinterpret_cast<AnyFn>(fn);
  k.predicate = reinterpret_cast<AnyFn>(predicate);
  k.boxed = &detail::Boxer<Op>::call;
  k.boxed_predicate = predicate ? &detail::Boxer<Op>::predicate : nullptr;
  return k;
}

}  // namespace opforge
