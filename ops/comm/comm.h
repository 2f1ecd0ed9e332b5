// Communication family: all_reduce, the collective of tensor parallelism.
//
// Greppable chain: op `all_reduce` -> all_reduce_reference (reference.cpp), all_reduce_nccl
// (cuda.cu). Cases in cases.cpp, checks / shapes / costs in comm.cpp.
//
// Note [stacked ranks]: opforge's tensors live on one device, so the op sees the tensor-parallel
// group as one tensor whose dim 0 is the rank: x[r] is rank r's buffer. That makes the collective
// checkable like any other op (the reference adds the rows) while the CUDA kernel runs it the way a
// tensor-parallel model does, one NCCL rank per GPU. The time a model pays per all-reduce (the
// collective on buffers already resident on each GPU, without the staging this layout needs) is
// what `opforge collect-comm` measures into the perf database, through the same NCCL entry points.
#pragma once

#include "opforge/op.h"
#include "opforge/registry.h"

namespace opforge {

struct AllReduce {
  static constexpr const char* name = "all_reduce";
  using Signature = void(const TensorView& y, const TensorView& x);
  static constexpr ArgSpec args[] = {{"y", ArgRole::out}, {"x", ArgRole::in}};
  static constexpr const char* doc =
      "Sum all-reduce across ranks (Note [stacked ranks]): x is [ranks, ...], row r the buffer of "
      "rank r; every row of y (same shape and dtype) is the sum of the rows of x, as "
      "torch.distributed.all_reduce(op=SUM) or vLLM's tensor_model_parallel_all_reduce leave on "
      "every rank. x and y are contiguous and do not overlap. The reference adds in rank order in "
      "double and rounds once; NCCL's order (ring or tree) is its own and, in bf16 / f16, it rounds "
      "each partial sum to the dtype, so results may differ from the reference by a few ulps "
      "per rank. No backward op: the gradient of an all-reduce is an all-reduce of the gradient.";
  static void check(const TensorView& y, const TensorView& x);
};

void all_reduce_reference(const Context&, const TensorView& y, const TensorView& x);

void register_comm(Registry& reg);  // comm.cpp: the op, its reference kernel, cases

}  // namespace opforge
