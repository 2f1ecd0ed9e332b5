// What an op is, at compile time.
//
// An op is a struct with static members (see ops/norm/norm.h for real ones):
//
//   struct RmsNorm {
//     static constexpr const char* name = "rms_norm";
//     using Signature = void(const TensorView& y, const TensorView& x, const TensorView& w,
//                            double eps, double offset);
//     static constexpr ArgSpec args[] = {{"y", ArgRole::out}, {"x", ArgRole::in}, ...};
//     static constexpr const char* doc = "y = x / sqrt(mean(x^2) + eps) * (w + offset) ...";
//     static void check(const TensorView& y, ...);   // throws opforge::Error, writes nothing
//   };
//
// Signature parameter types are limited to: const TensorView&, int64_t, double, bool,
// std::string_view. A kernel of the op has type `void(const Context&, <Signature params>)`
// (OpTraits<Op>::Kernel); Registry::add_kernel static_asserts it, so a kernel written against a
// stale signature does not compile (tests/compile_fail/ proves that).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "opforge/device.h"
#include "opforge/tensor.h"
#include "opforge/value.h"

namespace opforge {

// What every kernel receives besides the op's arguments.
struct Context {
  Device device{};
  Stream stream{};
};

template <class T> struct ArgTypeOf;
template <> struct ArgTypeOf<const TensorView&> { static constexpr ArgType value = ArgType::tensor; };
template <> struct ArgTypeOf<int64_t> { static constexpr ArgType value = ArgType::i64; };
template <> struct ArgTypeOf<double> { static constexpr ArgType value = ArgType::f64; };
template <> struct ArgTypeOf<bool> { static constexpr ArgType value = ArgType::boolean; };
template <> struct ArgTypeOf<std::string_view> { static constexpr ArgType value = ArgType::string; };

template <class Sig> struct SignatureTraits;
template <class... A> struct SignatureTraits<void(A...)> {
  static constexpr size_t arity = sizeof...(A);
  using Kernel = void(const Context&, A...);
  // Applicability predicate: nullptr when the kernel accepts the arguments, else a static string
  // saying why not ("hidden % 8 != 0"). No allocation: it runs on every call of a slot.
  using Predicate = const char*(A...);
  static constexpr ArgType types[] = {ArgTypeOf<A>::value..., ArgType::tensor};  // +1: never empty
};

template <class Op> struct OpTraits : SignatureTraits<typename Op::Signature> {
  static_assert(std::size(Op::args) == SignatureTraits<typename Op::Signature>::arity,
                "opforge: Op::args must name every parameter of Op::Signature");
};

// Roofline numbers of one call: the fewest bytes it must move and the flops it must do.
struct Cost {
  double bytes = 0;
  double flops = 0;
};
// Bytes of a tensor's elements (cost models count each input read once, each output written once).
inline double bytes_of(const TensorView& t) { return double(t.numel()) * double(t.itemsize()); }

// ---- harness cases -------------------------------------------------------------------------
// training: training-step shapes that only a GPU times in reasonable time (8,192 tokens x a 128k
// vocab); run only when asked for (--group training or --case), never by default.
enum class CaseGroup : uint8_t { small, medium, large, edge, training };
const char* case_group_name(CaseGroup g);

enum class Fill : uint8_t {
  normal_outliers,  // N(0,1) with ~1% of elements scaled by 8..32 (fixed seed per case)
  uniform_positive, // U(0.5, 1.5): weights, scales
  normal,           // N(0,1), no outliers
  zeros,
  uniform,          // U(low, high)
  integers,         // integers drawn uniformly from [low, high) (ids, positions, labels)
  values,           // the explicit list TensorInit::values, cycled (offsets, lengths)
};

// A tensor a case wants. dtype: std::nullopt follows the dtype under test (floating inputs),
// a fixed value pins it (ids, masks). row_pad > 0 gives rows a stride of last_dim + row_pad.
struct TensorInit {
  Shape shape;
  Fill fill = Fill::normal_outliers;
  int64_t row_pad = 0;
  bool fixed_dtype = false;
  DType dtype = DType::f32;
  double scale = 1.0;
  double low = 0.0;   // Fill::uniform and Fill::integers
  double high = 1.0;
  std::vector<double> values;  // Fill::values
};

struct CaseArg {
  std::string name;
  std::variant<TensorInit, Value> init;  // TensorInit for tensors, a scalar Value otherwise
};

// One case of an op. Inputs and scalars are listed by argument name; outputs left out are
// allocated from the op's shape function (contiguous); an output listed with a TensorInit is
// allocated with that layout (e.g. padded rows).
struct Case {
  std::string label;
  CaseGroup group = CaseGroup::small;
  std::vector<CaseArg> args;
  std::vector<DType> dtypes;  // empty: every floating dtype the kernel under test claims
  // (output, input) pairs run in place: the output is the input's buffer (kernels that declare
  // in_place are checked this way; others skip the case).
  std::vector<std::pair<std::string, std::string>> in_place;
};

// Shape function: which outputs to allocate for the given inputs.
struct OutputSpec {
  std::string name;
  Shape shape;
  DType dtype;
};

}  // namespace opforge
