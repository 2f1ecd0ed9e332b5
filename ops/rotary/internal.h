// Rotary family internals shared by rotary.cpp, reference.cpp, cpu.cpp and cases.cpp.
#pragma once

#include <vector>

#include "ops/rotary/rotary.h"

namespace opforge {

// What every rotary kernel receives (plain data; strides in elements). Both ops reduce to it:
// rotary_embedding reads cos / sin from cache rows picked by positions, apply_rotary_emb from
// row t of its cos / sin tensors; the backward ops set sin_sign = -1 (Note [rotary pairs]).
struct RotaryPart {
  const void* src = nullptr;  // heads of token t at src + t * src_token_stride + h * src_head_stride
  void* dst = nullptr;        // may equal src (in place)
  int64_t n_heads = 0;
  int64_t src_token_stride = 0, src_head_stride = 0;
  int64_t dst_token_stride = 0, dst_head_stride = 0;
};

struct RotaryPlan {
  DType dtype = DType::f32;
  bool neox = true;
  double sin_sign = 1.0;
  int64_t tokens = 0;
  int64_t head_size = 0;
  int64_t half = 0;                   // rotary_dim / 2
  const int64_t* positions = nullptr;  // nullptr: token t uses cos / sin row t
  const void* cos = nullptr;           // row r at cos + r * cos_stride (half elements)
  const void* sin = nullptr;
  int64_t cos_stride = 0, sin_stride = 0;
  RotaryPart parts[2];
  int n_parts = 0;
};

// rotary.cpp: the plans of the two op forms.
RotaryPlan rotary_embedding_plan(const TensorView& positions, const TensorView& query,
                                 const TensorView& key, const TensorView& cos_sin_cache,
                                 int64_t head_size, bool is_neox, double sin_sign);
RotaryPlan apply_rotary_plan(const TensorView& y, const TensorView& x, const TensorView& cos,
                             const TensorView& sin, bool is_neox, double sin_sign);

// reference.cpp / cpu.cpp: run a plan.
void rotary_reference_run(const RotaryPlan& p);
void rotary_cpu_run(const RotaryPlan& p);
const char* rotary_cpu_dtype_reason(const TensorView& t);

// cases.cpp
std::vector<Case> rotary_embedding_cases();
std::vector<Case> rotary_embedding_backward_cases();
std::vector<Case> apply_rotary_emb_cases();
std::vector<Case> apply_rotary_emb_backward_cases();

}  // namespace opforge
