// Reference kernels of the attention family: the oracle of the harness and every policy's last
// resort. For each sequence, query head and query position: the full row of scores, its softmax,
// the weighted sum; all in double, each output rounded once when stored. Rows follow
// Note [attention layout]; the mask is Note [attention mask].
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention/internal.h"

namespace opforge {

namespace {

// Element d of (token, head) row `row` of a Note [attention layout] tensor.
double at(const TensorView& t, int64_t row, int64_t d) {
  return load_as_double(t.data, t.dtype, row * t.row_stride() + d);
}
void put(const TensorView& t, int64_t row, int64_t d, double v) {
  store_from_double(t.data, t.dtype, row * t.row_stride() + d, v);
}

double dot(const TensorView& a, int64_t row_a, const TensorView& b, int64_t row_b, int64_t dim) {
  double s = 0;
  for (int64_t d = 0; d < dim; ++d) s += at(a, row_a, d) * at(b, row_b, d);
  return s;
}

// Softmax weights p[j - lo] over keys [lo, hi) of one query row; returns log sum exp of the
// scores. `q_row` indexes q; key j is row k_row(j) of k.
template <class KeyRow>
double softmax_row(const TensorView& q, int64_t q_row, const TensorView& k, KeyRow k_row,
                   int64_t lo, int64_t hi, double scale, std::vector<double>& p) {
  const int64_t dim = q.size(-1);
  p.assign(size_t(hi - lo), 0.0);
  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t j = lo; j < hi; ++j) {
    p[size_t(j - lo)] = scale * dot(q, q_row, k, k_row(j), dim);
    max_score = std::max(max_score, p[size_t(j - lo)]);
  }
  double sum = 0;
  for (double& e : p) sum += (e = std::exp(e - max_score));
  for (double& e : p) e /= sum;
  return max_score + std::log(sum);
}

}  // namespace

void attention_prefill_reference(const Context&, const TensorView& out, const TensorView& lse,
                                 const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& cu_seqlens, bool causal, double softmax_scale,
                                 int64_t window_left) {
  const int64_t tokens = q.size(0), q_heads = q.size(1), dim = q.size(2), kv_heads = k.size(1);
  const int64_t group = q_heads / kv_heads;
  const double scale = attention_scale(softmax_scale, dim);
  const std::vector<int64_t> cu = index_values(cu_seqlens);
  std::vector<double> p;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t start = cu[b], n = cu[b + 1] - cu[b];
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t g = h / group;
      auto kv_row = [&](int64_t j) { return (start + j) * kv_heads + g; };
      for (int64_t i = 0; i < n; ++i) {
        const int64_t lo = attention_key_begin(i, window_left), hi = attention_key_end(i, n, causal);
        const int64_t q_row = (start + i) * q_heads + h;
        const double log_sum = softmax_row(q, q_row, k, kv_row, lo, hi, scale, p);
        for (int64_t d = 0; d < dim; ++d) {
          double acc = 0;
          for (int64_t j = lo; j < hi; ++j) acc += p[size_t(j - lo)] * at(v, kv_row(j), d);
          put(out, q_row, d, acc);
        }
        store_from_double(lse.data, lse.dtype, h * tokens + start + i, log_sum);
      }
    }
  }
}

void attention_prefill_backward_reference(const Context&, const TensorView& dq,
                                          const TensorView& dk, const TensorView& dv,
                                          const TensorView& dout, const TensorView& q,
                                          const TensorView& k, const TensorView& v,
                                          const TensorView& out, const TensorView& lse,
                                          const TensorView& cu_seqlens, bool causal,
                                          double softmax_scale, int64_t window_left) {
  const int64_t tokens = q.size(0), q_heads = q.size(1), dim = q.size(2), kv_heads = k.size(1);
  const int64_t group = q_heads / kv_heads;
  const double scale = attention_scale(softmax_scale, dim);
  const std::vector<int64_t> cu = index_values(cu_seqlens);
  // dk and dv sum over queries and over the query heads of a group: accumulate in double.
  std::vector<double> dk_acc(size_t(tokens * kv_heads * dim), 0.0), dv_acc(dk_acc.size(), 0.0);
  std::vector<double> dq_row(static_cast<size_t>(dim));
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t start = cu[b], n = cu[b + 1] - cu[b];
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t g = h / group;
      auto kv_row = [&](int64_t j) { return (start + j) * kv_heads + g; };
      for (int64_t i = 0; i < n; ++i) {
        const int64_t lo = attention_key_begin(i, window_left), hi = attention_key_end(i, n, causal);
        const int64_t q_row = (start + i) * q_heads + h;
        const double row_lse = load_as_double(lse.data, lse.dtype, h * tokens + start + i);
        const double delta = dot(dout, q_row, out, q_row, dim);
        std::fill(dq_row.begin(), dq_row.end(), 0.0);
        for (int64_t j = lo; j < hi; ++j) {
          const double p = std::exp(scale * dot(q, q_row, k, kv_row(j), dim) - row_lse);
          const double ds = p * (dot(dout, q_row, v, kv_row(j), dim) - delta);
          double* dk_j = dk_acc.data() + (kv_row(j) * dim);
          double* dv_j = dv_acc.data() + (kv_row(j) * dim);
          for (int64_t d = 0; d < dim; ++d) {
            dv_j[d] += p * at(dout, q_row, d);
            dk_j[d] += scale * ds * at(q, q_row, d);
            dq_row[size_t(d)] += scale * ds * at(k, kv_row(j), d);
          }
        }
        for (int64_t d = 0; d < dim; ++d) put(dq, q_row, d, dq_row[size_t(d)]);
      }
    }
  }
  for (int64_t row = 0; row < tokens * kv_heads; ++row)
    for (int64_t d = 0; d < dim; ++d) {
      put(dk, row, d, dk_acc[size_t(row * dim + d)]);
      put(dv, row, d, dv_acc[size_t(row * dim + d)]);
    }
}

void attention_decode_reference(const Context&, const TensorView& out, const TensorView& q,
                                const TensorView& k_cache, const TensorView& v_cache,
                                const TensorView& seq_lens, double softmax_scale) {
  const int64_t batch = q.size(0), q_heads = q.size(1), dim = q.size(2);
  const int64_t max_ctx = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = q_heads / kv_heads;
  const double scale = attention_scale(softmax_scale, dim);
  const std::vector<int64_t> lens = index_values(seq_lens);
  std::vector<double> p;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t q_row = b * q_heads + h;
      auto kv_row = [&](int64_t j) { return (b * max_ctx + j) * kv_heads + h / group; };
      if (lens[size_t(b)] > 0) softmax_row(q, q_row, k_cache, kv_row, 0, lens[size_t(b)], scale, p);
      else p.clear();  // no keys: out = 0
      for (int64_t d = 0; d < dim; ++d) {
        double acc = 0;
        for (size_t j = 0; j < p.size(); ++j) acc += p[j] * at(v_cache, kv_row(int64_t(j)), d);
        put(out, q_row, d, acc);
      }
    }
  }
}

}  // namespace opforge
