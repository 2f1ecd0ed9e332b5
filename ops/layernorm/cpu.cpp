// CPU kernels of layer_norm, group_norm and their backward ops: layer_norm_cpu,
// layer_norm_backward_cpu, group_norm_cpu, group_norm_backward_cpu.
//
// Assumes: layer_norm rows follow Note [row layout] (unit-stride rows, any uniform row stride);
// group_norm tensors are contiguous, so a group (n, g) is one run of C / G * spatial elements;
// f32 / bf16 / f16 (f64 goes to the reference: the predicates say so); the op's check has run.
//
// Why it is fast:
// - One Highway source, runtime dispatch (4 / 8 / 16 f32 lanes on SSE4 / AVX2 / AVX-512);
//   bf16 / f16 are widened to f32 in registers and rounded once on the store (Note [vector
//   rounding]). w and b are widened to f32 once per task, not once per row.
// - Note [shifted sums]: the statistics come from one read of the row (or group): with
//   K = its first element and d = x - K, mean = K + sum(d) / n and
//   var = sum(d^2) / n - (sum(d) / n)^2. Shifting by an element of the row keeps the subtraction
//   well conditioned (it is the textbook shifted-data variance), so no separate centring pass is
//   needed. The second pass (normalise; in the backward dx and the dw / db terms) re-reads the
//   row from L1 / L2: rows per task come from capacity_block (Note [tiling]) so a task's rows
//   fit half of a core's L2. Memory traffic is x + y (forward) or dy + x + dx (backward), the
//   roofline minimum. A group_norm group larger than half the L2 is read twice from memory.
// - The backward's four row sums (sum d, sum d^2, sum g, sum g d with g = dy * w) share that one
//   read; dx = rstd * (g - mean(g) - xhat * mean(g xhat)) needs nothing else.
// - OpenMP over tasks (parallel_tasks: one task means no parallel region, so decode rows pay no
//   fork). Backward dw / db: each chunk of rows (a count from Note [tiling], never per thread)
//   owns an f32 partial row; the partials are added in chunk order, vectorised over columns.
//   group_norm: each (n, group) task writes per-channel partials of row n; they are summed over
//   n in order. Both are deterministic and independent of the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/layernorm/cpu.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <memory>

#include "backends/cpu/simd-inl.h"
#include "hwy/highway.h"
#include "ops/layernorm/internal.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::layernorm_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace opforge::cpu::HWY_NAMESPACE;  // NOLINT: the SIMD vocabulary

// x - k at lanes [i, i + count), lanes past count zero (load_n gives them 0, and 0 - k is not).
template <class T> HWY_INLINE VF shifted(const T* x, int64_t i, size_t count, VF k) {
  const VF d = hn::Sub(load_n(x + i, count), k);
  if (HWY_LIKELY(count == hn::Lanes(DF()))) return d;
  return hn::IfThenElseZero(hn::FirstN(DF(), count), d);
}

// x - mean at lanes [i, i + count) as (x - k) - mean_d: x - k is exact when x and k are close
// (Sterbenz) and mean_d is small, so no f32 rounding of the large mean enters xhat.
template <class T> HWY_INLINE VF centred(const T* x, size_t count, VF k, VF mean_d) {
  return hn::Sub(hn::Sub(load_n(x, count), k), mean_d);
}

// Four sums over n elements at once: term(i, count, a, b, c, d). Four independent accumulator
// chains, enough to hide the latency of the multiply-adds.
struct Sums4 {
  float a = 0, b = 0, c = 0, d = 0;
};
template <class Term> HWY_INLINE Sums4 sum_over4(int64_t n, Term&& term) {
  const DF df;
  VF a = hn::Zero(df), b = hn::Zero(df), c = hn::Zero(df), d = hn::Zero(df);
  for_each_vector(n, [&](int64_t i, size_t count) { term(i, count, a, b, c, d); });
  return {sum_lanes(a), sum_lanes(b), sum_lanes(c), sum_lanes(d)};
}

// Note [shifted sums]: mean and rstd from sum(d), sum(d^2) over n elements, d = x - k.
struct Stats {
  float mean_d = 0;  // mean of d: mean of x minus k
  float rstd = 0;
};
HWY_INLINE Stats stats_of(float sum_d, float sum_dd, int64_t n, float eps) {
  const float mean_d = sum_d / float(n);
  const float var = std::max(sum_dd / float(n) - mean_d * mean_d, 0.0f);
  return {mean_d, 1.0f / std::sqrt(var + eps)};
}

// Element 0 of x as f32.
template <class T> HWY_INLINE float first_of(const T* x) { return float(*x); }

// ---- layer_norm forward ------------------------------------------------------------------------
template <class T>
void ln_forward_row(const T* x, const float* w, const float* b, T* y, int64_t hidden, float eps) {
  const VF k = hn::Set(DF(), first_of(x));
  auto [sum_d, sum_dd] = sum_over2(hidden, [&](int64_t i, size_t count, VF& acc_d, VF& acc_dd) {
    const VF d = shifted(x, i, count, k);
    acc_d = hn::Add(acc_d, d);
    acc_dd = hn::MulAdd(d, d, acc_dd);
  });
  const Stats s = stats_of(sum_d, sum_dd, hidden, eps);
  const VF mean_d = hn::Set(DF(), s.mean_d), rstd = hn::Set(DF(), s.rstd);
  for_each_vector(hidden, [&](int64_t i, size_t count) {  // y may alias x: read, then write
    const VF xhat = hn::Mul(centred(x + i, count, k, mean_d), rstd);
    store_n(hn::MulAdd(xhat, load_n(w + i, count), load_n(b + i, count)), y + i, count);
  });
}

// w and b (zeros when b is none) widened to f32: the per-column factors of one task.
template <class T> struct Params {
  std::unique_ptr<float[]> w, b;
  Params(const void* w_src, const void* b_src, int64_t n) : w(new float[size_t(n)]), b(new float[size_t(n)]) {
    for_each_vector(n, [&](int64_t i, size_t count) {
      store_n(load_n(static_cast<const T*>(w_src) + i, count), w.get() + i, count);
      const VF bias = b_src ? load_n(static_cast<const T*>(b_src) + i, count) : hn::Zero(DF());
      store_n(bias, b.get() + i, count);
    });
  }
};

template <class T> void ln_forward_rows_typed(const LayerNormRows& a, int64_t begin, int64_t end) {
  if (a.hidden == 0) return;
  const Params<T> p(a.w, a.b, a.hidden);
  for (int64_t row = begin; row < end; ++row)
    ln_forward_row(static_cast<const T*>(a.x) + row * a.x_stride, p.w.get(), p.b.get(),
                   static_cast<T*>(a.y) + row * a.y_stride, a.hidden, a.eps);
}

void layer_norm_forward_rows(const LayerNormRows& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::bf16: return ln_forward_rows_typed<bf16_t>(a, begin, end);
    case DType::f16: return ln_forward_rows_typed<f16_t>(a, begin, end);
    default: return ln_forward_rows_typed<float>(a, begin, end);
  }
}

// ---- layer_norm backward -----------------------------------------------------------------------
// One row: dx, and dy * xhat, dy added into the chunk's partial rows dw_part, db_part.
template <class T>
void ln_backward_row(const T* dy, const T* x, const float* w, T* dx, float* dw_part,
                     float* db_part, int64_t hidden, float eps) {
  const VF k = hn::Set(DF(), first_of(x));
  const Sums4 sums = sum_over4(hidden, [&](int64_t i, size_t count, VF& sd, VF& sdd, VF& sg, VF& sgd) {
    const VF d = shifted(x, i, count, k);
    const VF g = hn::Mul(load_n(dy + i, count), load_n(w + i, count));
    sd = hn::Add(sd, d);
    sdd = hn::MulAdd(d, d, sdd);
    sg = hn::Add(sg, g);
    sgd = hn::MulAdd(g, d, sgd);
  });
  const Stats s = stats_of(sums.a, sums.b, hidden, eps);
  const float n = float(hidden);
  const float mean_g = sums.c / n;
  const float mean_gx = s.rstd * (sums.d - s.mean_d * sums.c) / n;  // mean(g * xhat)
  const VF mean_d = hn::Set(DF(), s.mean_d), rstd = hn::Set(DF(), s.rstd);
  const VF vmean_g = hn::Set(DF(), mean_g), vmean_gx = hn::Set(DF(), mean_gx);
  for_each_vector(hidden, [&](int64_t i, size_t count) {
    const VF g_up = load_n(dy + i, count);
    const VF xhat = hn::Mul(centred(x + i, count, k, mean_d), rstd);
    const VF g = hn::Mul(g_up, load_n(w + i, count));
    const VF inner = hn::NegMulAdd(xhat, vmean_gx, hn::Sub(g, vmean_g));
    store_n(hn::Mul(rstd, inner), dx + i, count);
    store_n(hn::MulAdd(g_up, xhat, load_n(dw_part + i, count)), dw_part + i, count);
    store_n(hn::Add(g_up, load_n(db_part + i, count)), db_part + i, count);
  });
}

template <class T>
void ln_backward_chunk_typed(const LayerNormRows& a, int64_t begin, int64_t end, float* dw_part,
                             float* db_part) {
  std::fill(dw_part, dw_part + a.hidden, 0.0f);
  std::fill(db_part, db_part + a.hidden, 0.0f);
  if (a.hidden == 0) return;
  const Params<T> p(a.w, nullptr, a.hidden);
  for (int64_t row = begin; row < end; ++row)
    ln_backward_row(static_cast<const T*>(a.dy) + row * a.dy_stride,
                    static_cast<const T*>(a.x) + row * a.x_stride, p.w.get(),
                    static_cast<T*>(a.dx) + row * a.dx_stride, dw_part, db_part, a.hidden, a.eps);
}

void layer_norm_backward_chunk(const LayerNormRows& a, int64_t begin, int64_t end, float* dw_part,
                               float* db_part) {
  switch (a.dtype) {
    case DType::bf16: return ln_backward_chunk_typed<bf16_t>(a, begin, end, dw_part, db_part);
    case DType::f16: return ln_backward_chunk_typed<f16_t>(a, begin, end, dw_part, db_part);
    default: return ln_backward_chunk_typed<float>(a, begin, end, dw_part, db_part);
  }
}

// out[j] = sum over parts p, in order, of partials[p * stride + j], for j in [begin, end).
template <class T>
void reduce_typed(const float* partials, int64_t n_parts, int64_t stride, T* out, int64_t begin,
                  int64_t end) {
  for_each_vector(end - begin, [&](int64_t i, size_t count) {
    const int64_t j = begin + i;
    VF sum = hn::Zero(DF());
    for (int64_t p = 0; p < n_parts; ++p) sum = hn::Add(sum, load_n(partials + p * stride + j, count));
    store_n(sum, out + j, count);
  });
}

void reduce_partials(const float* partials, int64_t n_parts, int64_t stride, DType dtype, void* out,
                     int64_t begin, int64_t end) {
  switch (dtype) {
    case DType::bf16:
      return reduce_typed(partials, n_parts, stride, static_cast<bf16_t*>(out), begin, end);
    case DType::f16:
      return reduce_typed(partials, n_parts, stride, static_cast<f16_t*>(out), begin, end);
    default: return reduce_typed(partials, n_parts, stride, static_cast<float*>(out), begin, end);
  }
}

// ---- group_norm --------------------------------------------------------------------------------
// Forward of group (n, g): statistics over the whole contiguous group, then per channel
// y = (x - mean) * (rstd * w[c]) + b[c].
template <class T> void gn_forward_group(const GroupNormArgs& a, int64_t group) {
  const int64_t per_group = a.channels / a.groups, len = per_group * a.spatial;
  if (len == 0) return;
  const T* x = static_cast<const T*>(a.x) + group * len;
  T* y = static_cast<T*>(a.y) + group * len;
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  const int64_t first_channel = (group % a.groups) * per_group;
  const VF k = hn::Set(DF(), first_of(x));
  auto [sum_d, sum_dd] = sum_over2(len, [&](int64_t i, size_t count, VF& acc_d, VF& acc_dd) {
    const VF d = shifted(x, i, count, k);
    acc_d = hn::Add(acc_d, d);
    acc_dd = hn::MulAdd(d, d, acc_dd);
  });
  const Stats s = stats_of(sum_d, sum_dd, len, a.eps);
  const VF mean_d = hn::Set(DF(), s.mean_d);
  for (int64_t c = 0; c < per_group; ++c) {
    const int64_t channel = first_channel + c;
    const VF scale = hn::Set(DF(), s.rstd * first_of(w + channel));
    const VF shift = hn::Set(DF(), first_of(b + channel));
    const T* xc = x + c * a.spatial;
    T* yc = y + c * a.spatial;
    for_each_vector(a.spatial, [&](int64_t i, size_t count) {
      store_n(hn::MulAdd(centred(xc + i, count, k, mean_d), scale, shift), yc + i, count);
    });
  }
}

// Backward of group (n, g): per-channel sums of d, d^2, dy and dy d in one read, then dx; the
// channel's dw and db terms go to dw_part[c], db_part[c] (row n of the [N, C] partials).
template <class T>
void gn_backward_group(const GroupNormArgs& a, int64_t group, float* dw_part, float* db_part) {
  const int64_t per_group = a.channels / a.groups, len = per_group * a.spatial;
  const int64_t first_channel = (group % a.groups) * per_group;
  dw_part += first_channel;
  db_part += first_channel;
  if (len == 0) {
    std::fill(dw_part, dw_part + per_group, 0.0f);
    std::fill(db_part, db_part + per_group, 0.0f);
    return;
  }
  const T* x = static_cast<const T*>(a.x) + group * len;
  const T* dy = static_cast<const T*>(a.dy) + group * len;
  T* dx = static_cast<T*>(a.dx) + group * len;
  const T* w = static_cast<const T*>(a.w) + first_channel;
  const VF k = hn::Set(DF(), first_of(x));
  float sum_d = 0, sum_dd = 0, sum_g = 0, sum_gd = 0;
  for (int64_t c = 0; c < per_group; ++c) {
    const int64_t off = c * a.spatial;
    const Sums4 cs = sum_over4(a.spatial, [&](int64_t i, size_t count, VF& sd, VF& sdd, VF& sy, VF& syd) {
      const VF d = shifted(x + off, i, count, k);
      const VF up = load_n(dy + off + i, count);
      sd = hn::Add(sd, d);
      sdd = hn::MulAdd(d, d, sdd);
      sy = hn::Add(sy, up);
      syd = hn::MulAdd(up, d, syd);
    });
    const float wc = first_of(w + c);
    sum_d += cs.a;
    sum_dd += cs.b;
    sum_g += wc * cs.c;
    sum_gd += wc * cs.d;
    db_part[c] = cs.c;
    dw_part[c] = cs.d;  // sum dy d for now; dw needs the group's mean and rstd
  }
  const Stats s = stats_of(sum_d, sum_dd, len, a.eps);
  const float n = float(len);
  const VF mean_d = hn::Set(DF(), s.mean_d), rstd = hn::Set(DF(), s.rstd);
  const VF mean_g = hn::Set(DF(), sum_g / n);
  const VF mean_gx = hn::Set(DF(), s.rstd * (sum_gd - s.mean_d * sum_g) / n);
  for (int64_t c = 0; c < per_group; ++c) {
    dw_part[c] = s.rstd * (dw_part[c] - s.mean_d * db_part[c]);  // sum dy * xhat
    const int64_t off = c * a.spatial;
    const VF wc = hn::Set(DF(), first_of(w + c));
    for_each_vector(a.spatial, [&](int64_t i, size_t count) {
      const VF xhat = hn::Mul(centred(x + off + i, count, k, mean_d), rstd);
      const VF g = hn::Mul(load_n(dy + off + i, count), wc);
      const VF inner = hn::NegMulAdd(xhat, mean_gx, hn::Sub(g, mean_g));
      store_n(hn::Mul(rstd, inner), dx + off + i, count);
    });
  }
}

template <class T>
void gn_groups_typed(const GroupNormArgs& a, int64_t begin, int64_t end, float* dw_part,
                     float* db_part) {
  for (int64_t group = begin; group < end; ++group) {
    if (!a.dy) {
      gn_forward_group<T>(a, group);
    } else {
      const int64_t n = group / a.groups;
      gn_backward_group<T>(a, group, dw_part + n * a.channels, db_part + n * a.channels);
    }
  }
}

// Groups [begin, end) of group_norm (forward when a.dy is nullptr, else backward; partials are
// [batch, channels] f32).
void group_norm_groups(const GroupNormArgs& a, int64_t begin, int64_t end, float* dw_part,
                       float* db_part) {
  switch (a.dtype) {
    case DType::bf16: return gn_groups_typed<bf16_t>(a, begin, end, dw_part, db_part);
    case DType::f16: return gn_groups_typed<f16_t>(a, begin, end, dw_part, db_part);
    default: return gn_groups_typed<float>(a, begin, end, dw_part, db_part);
  }
}

}  // namespace opforge::layernorm_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backends/cpu/parallel.h"
#include "backends/cpu/tiling.h"

namespace opforge {
namespace layernorm_cpu {
HWY_EXPORT(layer_norm_forward_rows);
HWY_EXPORT(layer_norm_backward_chunk);
HWY_EXPORT(reduce_partials);
HWY_EXPORT(group_norm_groups);
}  // namespace layernorm_cpu

namespace {

// Blocks of `rows` units of `unit` elements each: Note [tiling] over L2 with
// `tensors_per_element` tensors of `itemsize` touched at each element.
cpu::RowTasks tasks_of(int64_t rows, int64_t unit, int64_t tensors_per_element, int64_t itemsize) {
  cpu::TileSpec spec;
  spec.bytes_per_element = tensors_per_element * itemsize;
  spec.multiplier = std::max<int64_t>(unit, 1);
  spec.level = cpu::CacheLevel::l2;
  return {rows, cpu::capacity_block(spec)};
}

// dst[j] = sum over parts, in order, of partials[part * columns + j]: columns split into tasks
// by Note [tiling] with every part's column block in the working set.
void reduce_in_order(const float* partials, int64_t n_parts, int64_t columns, DType dtype,
                     void* dst) {
  cpu::TileSpec spec;
  spec.bytes_per_element = int64_t(sizeof(float)) * std::max<int64_t>(n_parts, 1);
  spec.level = cpu::CacheLevel::l2;
  const cpu::RowTasks tasks{columns, cpu::capacity_block(spec)};
  auto* reduce_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::reduce_partials);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) {
    reduce_fn(partials, n_parts, columns, dtype, dst, tasks.begin(t), tasks.end(t));
  });
}

std::unique_ptr<float[]> floats(int64_t n) {
  return std::unique_ptr<float[]>(new float[size_t(std::max<int64_t>(n, 1))]);
}

GroupNormArgs group_args(const TensorView& x, const TensorView& w, int64_t num_groups, double eps) {
  GroupNormArgs a;
  a.dtype = x.dtype;
  a.batch = x.size(0);
  a.channels = x.size(1);
  a.groups = num_groups;
  a.spatial = a.batch > 0 && a.channels > 0 ? x.numel() / (a.batch * a.channels) : 0;
  a.eps = float(eps);
  a.x = x.data;
  a.w = w.data;
  return a;
}

}  // namespace

void layer_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, double eps) {
  LayerNormRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.eps = float(eps);
  a.x = x.data;
  a.x_stride = x.row_stride();
  a.w = w.data;
  a.b = b.defined() ? b.data : nullptr;
  a.y = y.data;
  a.y_stride = y.row_stride();
  const cpu::RowTasks tasks = tasks_of(x.rows(), a.hidden, 2, x.itemsize());
  auto* rows_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::layer_norm_forward_rows);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) { rows_fn(a, tasks.begin(t), tasks.end(t)); });
}

void layer_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                             const TensorView& db, const TensorView& dy, const TensorView& x,
                             const TensorView& w, double eps) {
  LayerNormRows a;
  a.dtype = x.dtype;
  a.hidden = x.size(-1);
  a.eps = float(eps);
  a.x = x.data;
  a.x_stride = x.row_stride();
  a.w = w.data;
  a.dy = dy.data;
  a.dy_stride = dy.row_stride();
  a.dx = dx.data;
  a.dx_stride = dx.row_stride();
  const cpu::RowTasks chunks = tasks_of(x.rows(), a.hidden, 3, x.itemsize());
  const int64_t n_chunks = chunks.count(), hidden = a.hidden;
  auto dw_parts = floats(n_chunks * hidden), db_parts = floats(n_chunks * hidden);
  auto* chunk_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::layer_norm_backward_chunk);
  cpu::parallel_tasks(n_chunks, [&](int64_t c) {
    chunk_fn(a, chunks.begin(c), chunks.end(c), dw_parts.get() + c * hidden,
             db_parts.get() + c * hidden);
  });
  reduce_in_order(dw_parts.get(), n_chunks, hidden, x.dtype, dw.data);
  reduce_in_order(db_parts.get(), n_chunks, hidden, x.dtype, db.data);
}

void group_norm_cpu(const Context&, const TensorView& y, const TensorView& x, const TensorView& w,
                    const TensorView& b, int64_t num_groups, double eps) {
  GroupNormArgs a = group_args(x, w, num_groups, eps);
  a.b = b.data;
  a.y = y.data;
  const int64_t len = a.channels / num_groups * a.spatial;
  const cpu::RowTasks tasks = tasks_of(a.batch * num_groups, len, 2, x.itemsize());
  auto* groups_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::group_norm_groups);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) {
    groups_fn(a, tasks.begin(t), tasks.end(t), nullptr, nullptr);
  });
}

void group_norm_backward_cpu(const Context&, const TensorView& dx, const TensorView& dw,
                             const TensorView& db, const TensorView& dy, const TensorView& x,
                             const TensorView& w, int64_t num_groups, double eps) {
  GroupNormArgs a = group_args(x, w, num_groups, eps);
  a.dy = dy.data;
  a.dx = dx.data;
  const int64_t len = a.channels / num_groups * a.spatial;
  auto dw_parts = floats(a.batch * a.channels), db_parts = floats(a.batch * a.channels);
  const cpu::RowTasks tasks = tasks_of(a.batch * num_groups, len, 3, x.itemsize());
  auto* groups_fn = HWY_DYNAMIC_DISPATCH(layernorm_cpu::group_norm_groups);
  cpu::parallel_tasks(tasks.count(), [&](int64_t t) {
    groups_fn(a, tasks.begin(t), tasks.end(t), dw_parts.get(), db_parts.get());
  });
  reduce_in_order(dw_parts.get(), a.batch, a.channels, x.dtype, dw.data);
  reduce_in_order(db_parts.get(), a.batch, a.channels, x.dtype, db.data);
}

const char* layer_norm_cpu_applicable(const TensorView&, const TensorView& x, const TensorView&,
                                      const TensorView&, double) {
  return layernorm_cpu_reason(x);
}
const char* layer_norm_backward_cpu_applicable(const TensorView&, const TensorView&,
                                               const TensorView&, const TensorView&,
                                               const TensorView& x, const TensorView&, double) {
  return layernorm_cpu_reason(x);
}
const char* group_norm_cpu_applicable(const TensorView&, const TensorView& x, const TensorView&,
                                      const TensorView&, int64_t, double) {
  return layernorm_cpu_reason(x);
}
const char* group_norm_backward_cpu_applicable(const TensorView&, const TensorView&,
                                               const TensorView&, const TensorView&,
                                               const TensorView& x, const TensorView&, int64_t,
                                               double) {
  return layernorm_cpu_reason(x);
}

}  // namespace opforge
#endif  // HWY_ONCE
