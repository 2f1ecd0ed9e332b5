// Reference kernel of the routing family: per token, plain loops in double. Scores, keys and
// group scores exactly as routing.h's doc strings say, then rounds of "pick the best remaining"
// where a later (higher) id wins only with a strictly larger key (Note [routing ties]).
#include <cmath>
#include <vector>

#include "ops/routing/internal.h"

namespace opforge {

namespace {

// Index of the largest keys[i] among i with allowed[i] (strictly larger to replace: the lowest
// index wins ties); -1 when none is allowed.
int64_t best_remaining(const std::vector<double>& keys, const std::vector<bool>& allowed) {
  int64_t best = -1;
  for (int64_t i = 0; i < int64_t(keys.size()); ++i)
    if (allowed[size_t(i)] && (best < 0 || keys[size_t(i)] > keys[size_t(best)])) best = i;
  return best;
}

// Softmax or sigmoid of one row of logits.
std::vector<double> scores_of(const std::vector<double>& x, bool sigmoid) {
  std::vector<double> s(x.size());
  if (sigmoid) {
    for (size_t e = 0; e < x.size(); ++e) s[e] = 1.0 / (1.0 + std::exp(-x[e]));
    return s;
  }
  double max = -INFINITY, sum = 0;
  for (double v : x) max = std::max(max, v);
  for (size_t e = 0; e < x.size(); ++e) sum += s[e] = std::exp(x[e] - max);
  for (double& v : s) v /= sum;
  return s;
}

// Sum of the two largest values of keys[begin, end).
double top2_sum(const std::vector<double>& keys, int64_t begin, int64_t end) {
  double first = -INFINITY, second = -INFINITY;
  for (int64_t e = begin; e < end; ++e) {
    const double v = keys[size_t(e)];
    if (v > first) {
      second = first;
      first = v;
    } else if (v > second) {
      second = v;
    }
  }
  return first + second;
}

void route_token(const RoutingPlan& p, int64_t t) {
  const int64_t E = p.experts, group_size = E / p.groups;
  std::vector<double> x(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) x[size_t(e)] = load_as_double(p.logits, p.dtype, t * p.logits_stride + e);
  const std::vector<double> s = scores_of(x, p.sigmoid);
  std::vector<double> keys = x;  // Note [routing ties]: the logits rank like the scores
  if (p.bias)
    for (int64_t e = 0; e < E; ++e)
      keys[size_t(e)] = s[size_t(e)] + load_as_double(p.bias, p.bias_dtype, e * p.bias_stride);

  // Keep the topk_group best groups.
  std::vector<double> group_scores(size_t(p.groups));
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t begin = g * group_size, end = begin + group_size;
    double best = -INFINITY;
    for (int64_t e = begin; e < end; ++e) best = std::max(best, keys[size_t(e)]);
    group_scores[size_t(g)] = p.bias ? top2_sum(keys, begin, end) : best;
  }
  std::vector<bool> group_left(size_t(p.groups), true), allowed(size_t(E), false);
  for (int64_t round = 0; round < p.topk_group; ++round) {
    const int64_t g = best_remaining(group_scores, group_left);
    group_left[size_t(g)] = false;
    for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) allowed[size_t(e)] = true;
  }

  // The topk best experts among them, and their scores.
  std::vector<int64_t> ids(size_t(p.topk));
  double sum = 0;
  for (int64_t j = 0; j < p.topk; ++j) {
    ids[size_t(j)] = best_remaining(keys, allowed);
    allowed[size_t(ids[size_t(j)])] = false;
    sum += s[size_t(ids[size_t(j)])];
  }
  for (int64_t j = 0; j < p.topk; ++j) {
    double w = s[size_t(ids[size_t(j)])];
    if (p.renormalize) w /= sum;
    p.weights[t * p.weights_stride + j] = float(w * p.scaling);
    p.ids[t * p.ids_stride + j] = int32_t(ids[size_t(j)]);
  }
}

}  // namespace

void routing_reference_run(const RoutingPlan& p) {
  for (int64_t t = 0; t < p.tokens; ++t) route_token(p, t);
}

}  // namespace opforge
