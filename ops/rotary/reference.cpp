// Reference kernel of the rotary family: plain loops over tokens, heads and pairs in double, one
// rounding per stored element. Every rotary op and backward runs through rotary_reference_run.
#include "ops/rotary/internal.h"

namespace opforge {

namespace {

// Dim j of head h of token t in a part (element offsets from src / dst).
int64_t src_at(const RotaryPart& part, int64_t t, int64_t h, int64_t j) {
  return t * part.src_token_stride + h * part.src_head_stride + j;
}
int64_t dst_at(const RotaryPart& part, int64_t t, int64_t h, int64_t j) {
  return t * part.dst_token_stride + h * part.dst_head_stride + j;
}

// The two dims that form pair i (Note [rotary pairs]).
void pair_dims(const RotaryPlan& p, int64_t i, int64_t& first, int64_t& second) {
  first = p.neox ? i : 2 * i;
  second = p.neox ? i + p.half : 2 * i + 1;
}

}  // namespace

void rotary_reference_run(const RotaryPlan& p) {
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int64_t row = p.positions ? p.positions[t] : t;
    for (int part_index = 0; part_index < p.n_parts; ++part_index) {
      const RotaryPart& part = p.parts[part_index];
      for (int64_t h = 0; h < part.n_heads; ++h) {
        for (int64_t i = 0; i < p.half; ++i) {
          const double c = load_as_double(p.cos, p.dtype, row * p.cos_stride + i);
          const double s = p.sin_sign * load_as_double(p.sin, p.dtype, row * p.sin_stride + i);
          int64_t d1, d2;
          pair_dims(p, i, d1, d2);
          const double x1 = load_as_double(part.src, p.dtype, src_at(part, t, h, d1));
          const double x2 = load_as_double(part.src, p.dtype, src_at(part, t, h, d2));
          store_from_double(part.dst, p.dtype, dst_at(part, t, h, d1), x1 * c - x2 * s);
          store_from_double(part.dst, p.dtype, dst_at(part, t, h, d2), x2 * c + x1 * s);
        }
        if (part.dst == part.src) continue;  // in place: the pass-through dims are already there
        for (int64_t j = 2 * p.half; j < p.head_size; ++j)
          store_from_double(part.dst, p.dtype, dst_at(part, t, h, j),
                            load_as_double(part.src, p.dtype, src_at(part, t, h, j)));
      }
    }
  }
}

}  // namespace opforge
