// Fuzz mode of check: cases nobody wrote down, derived from the ones an op declares.
//
// Note [fuzz derivation]: draw i of an op starts from one of its declared cases of the small,
// medium and edge groups (large ones would make a draw slow), picked at random among those whose
// tensors fit kFuzzMaxElements. Every distinct positive extent that occurs in the shapes of the
// case's tensors is kept with probability 1/2, else replaced by a new value: log-uniform in
// [1, 4 v + 8], or one of the values kernels get wrong (v - 1, v + 1, a prime, 8 k + 1..7, 1..4).
// One old value maps to one new value everywhere in the case, so x [T, H] and w [H] stay
// consistent, and so do the integers that carry an extent: an integer scalar (head_size, topk,
// num_experts, group sizes) equal to a remapped extent takes its new value, as do the bounds of an
// integer fill (ids in [0, vocab)) and the entries of an explicit value list (offsets, lengths)
// equal to one. Value-list tensors keep their length: it is the length of the list, not a size of
// the problem. Row padding already present is redrawn in 0..9 (again one old pad, one new pad).
// A draw with a tensor over kFuzzMaxElements is redrawn (keeping more extents each time; the base
// itself fits, so this ends). Fill seeds come from the label (Note [poison and guards] fixes the
// rest), so every draw has fresh numbers.
//
// Many draws are invalid for the op (an odd last dim for a gated activation, heads that no longer
// divide). The reference decides: a draw it rejects with opforge::Error is "rejected", and every
// kernel must reject it too, with opforge::Error and without writing (check_modes.cpp). The
// generator is std::mt19937_64, whose sequence the standard fixes, with our own mapping to ranges
// (std::uniform_int_distribution differs between standard libraries), seeded from (seed, op, i):
// a draw is the same on every machine and does not depend on how many draws are asked for, so
// `--fuzz 8 --seed S op` reproduces draw fuzz7 of a larger run.
#include "harness/fuzz.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "harness/materialize.h"

namespace opforge::harness::detail {

namespace {

class Draw {
 public:
  explicit Draw(uint64_t seed) : g_(seed) {}
  double uniform() { return double(g_() >> 11) * 0x1p-53; }  // [0, 1)
  // Uniform in [lo, hi], by the high half of a 128-bit product (no library distribution).
  int64_t between(int64_t lo, int64_t hi) {
    const uint64_t n = uint64_t(hi - lo) + 1;
    return lo + int64_t((unsigned __int128)g_() * n >> 64);
  }
  bool coin() { return (g_() >> 63) != 0; }
  // Log-uniform in [1, hi].
  int64_t log_uniform(int64_t hi) {
    const int64_t v = int64_t(std::floor(std::exp(uniform() * std::log(double(hi) + 1.0))));
    return std::clamp<int64_t>(v, 1, hi);
  }

 private:
  std::mt19937_64 g_;
};

bool is_prime(int64_t n) {
  if (n < 2) return false;
  for (int64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// A new value for extent v.
int64_t new_extent(Draw& d, int64_t v) {
  const int64_t hi = 4 * v + 8;
  const double r = d.uniform();
  if (r < 0.35) return d.log_uniform(hi);
  if (r < 0.55) return v > 1 && d.coin() ? v - 1 : v + 1;
  if (r < 0.70) {
    int64_t p = d.log_uniform(hi);
    while (!is_prime(p)) ++p;
    return p;
  }
  if (r < 0.85) return 8 * d.log_uniform(std::max<int64_t>(1, hi / 8)) + d.between(1, 7);
  return d.between(1, 4);
}

bool is_value_list(const TensorInit& t) { return t.fill == Fill::values; }

// Follows an integer through the extent map (an integer that is no remapped extent stays).
int64_t mapped(const std::map<int64_t, int64_t>& m, int64_t v) {
  auto it = m.find(v);
  return it == m.end() ? v : it->second;
}

std::string dims_str(const Shape& s) {
  std::string out;
  for (int i = 0; i < s.ndim; ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return s.ndim == 0 ? "scalar" : out;
}

bool fits(const Case& c) {
  for (const CaseArg& a : c.args)
    if (const auto* t = std::get_if<TensorInit>(&a.init); t && t->shape.numel() > kFuzzMaxElements) return false;
  return true;
}

// Applies the extent and pad maps to a copy of the base. Returns the case and whether it fits.
Case apply(const Case& base, const std::map<int64_t, int64_t>& extents, const std::map<int64_t, int64_t>& pads) {
  Case c = base;
  for (CaseArg& a : c.args) {
    if (auto* t = std::get_if<TensorInit>(&a.init)) {
      if (!is_value_list(*t))
        for (int i = 0; i < t->shape.ndim; ++i) t->shape.dims[size_t(i)] = mapped(extents, t->shape[i]);
      if (t->row_pad > 0) t->row_pad = mapped(pads, t->row_pad);
      if (t->fill == Fill::integers) {
        // Bounds that are an extent (ids below vocab) follow it; others (positions, classes) stay.
        if (t->high == std::floor(t->high) && t->high > 0) t->high = double(mapped(extents, int64_t(t->high)));
        if (t->low == std::floor(t->low) && t->low > 0) t->low = double(mapped(extents, int64_t(t->low)));
      }
      if (is_value_list(*t))
        for (double& v : t->values)
          if (v == std::floor(v) && v > 0) v = double(mapped(extents, int64_t(v)));
    } else if (auto* i = std::get_if<int64_t>(&std::get<Value>(a.init)); i && *i > 0) {
      *i = mapped(extents, *i);
    }
  }
  return c;
}

}  // namespace

std::vector<const Case*> fuzz_bases(const Options& opt, const std::vector<Case>& cases) {
  std::vector<const Case*> out;
  for (const Case& c : cases) {
    if (c.group != CaseGroup::small && c.group != CaseGroup::medium && c.group != CaseGroup::edge) continue;
    if (!opt.cases.empty() && std::find(opt.cases.begin(), opt.cases.end(), c.label) == opt.cases.end()) continue;
    if (!opt.groups.empty() && std::find(opt.groups.begin(), opt.groups.end(), c.group) == opt.groups.end()) continue;
    if (fits(c)) out.push_back(&c);
  }
  return out;
}

Case fuzz_case(const std::vector<const Case*>& bases, uint64_t seed, const std::string& op_name, int index) {
  Draw d(mix_seed(seed, op_name, "fuzz", std::to_string(index)));
  const Case& base = *bases[size_t(d.between(0, int64_t(bases.size()) - 1))];
  std::set<int64_t> extents, pads;  // ordered: the draws do not depend on hashing
  for (const CaseArg& a : base.args) {
    const auto* t = std::get_if<TensorInit>(&a.init);
    if (!t) continue;
    if (t->row_pad > 0) pads.insert(t->row_pad);
    if (is_value_list(*t)) continue;
    for (int i = 0; i < t->shape.ndim; ++i)
      if (t->shape[i] > 0) extents.insert(t->shape[i]);
  }
  Case c;
  for (int attempt = 0;; ++attempt) {
    // Redraws keep more extents: 1/2, then 3/4 after 16 attempts, all after 32 (the base fits).
    const double keep = attempt < 16 ? 0.5 : attempt < 32 ? 0.75 : 1.0;
    std::map<int64_t, int64_t> em, pm;
    for (int64_t v : extents)
      if (d.uniform() >= keep) em[v] = new_extent(d, v);
    for (int64_t p : pads) pm[p] = d.between(0, 9);
    c = apply(base, em, pm);
    if (fits(c)) break;
  }
  c.label = "fuzz" + std::to_string(index) + "<-" + base.label + ":";
  bool first = true;
  for (const CaseArg& a : c.args) {
    const auto* t = std::get_if<TensorInit>(&a.init);
    if (!t) continue;
    c.label += (first ? " " : ", ") + a.name + " " + dims_str(t->shape);
    if (t->row_pad > 0) c.label += "+pad" + std::to_string(t->row_pad);
    first = false;
  }
  // Integer scalars that moved are part of what the draw is.
  for (size_t i = 0; i < c.args.size(); ++i) {
    const auto* v = std::get_if<Value>(&c.args[i].init);
    const int64_t* now = v ? std::get_if<int64_t>(v) : nullptr;
    if (now && *now != std::get<int64_t>(std::get<Value>(base.args[i].init)))
      c.label += ", " + c.args[i].name + "=" + std::to_string(*now);
  }
  return c;
}

std::vector<Case> fuzz_cases(const Options& opt, const OpEntry& op) {
  std::vector<Case> out;
  if (!op.cases || opt.fuzz <= 0) return out;
  const std::vector<Case> declared = op.cases();
  const std::vector<const Case*> bases = fuzz_bases(opt, declared);
  if (bases.empty()) return out;
  for (int i = 0; i < opt.fuzz; ++i) out.push_back(fuzz_case(bases, opt.fuzz_seed, op.name, i));
  return out;
}

}  // namespace opforge::harness::detail
