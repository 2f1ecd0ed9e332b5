// CUDA kernel of the communication family (ops/comm/cuda.cu), declared for registration and tests.
//   all_reduce_nccl  rank r of Note [stacked ranks] on GPU (d + r) mod n, NCCL's all-reduce
#pragma once

#include "ops/comm/comm.h"

namespace opforge {

void all_reduce_nccl(const Context&, const TensorView& y, const TensorView& x);
const char* all_reduce_nccl_applicable(const TensorView& y, const TensorView& x);

void register_comm_cuda(Registry& reg);

}  // namespace opforge
