// NCCL as opforge uses it: the few entry points of NCCL's stable C ABI (nccl.h), bound at run time
// by dlopen of $OPFORGE_NCCL_LIBRARY, else libnccl.so.2 from the loader's path, so neither the build
// nor a machine without NCCL depends on it. Shared by the all_reduce op's kernel (ops/comm/cuda.cu)
// and the all-reduce measurement behind `opforge collect-comm` (nccl_all_reduce.cu).
#pragma once

#include <string>

#include "opforge/dtype.h"

typedef struct CUstream_st* cudaStream_t;

namespace opforge::cuda::nccl {

using Comm = struct ncclComm*;
constexpr int kSum = 0;  // ncclRedOp_t ncclSum

struct Api {
  void* handle = nullptr;
  std::string error;  // why it could not be loaded; empty when every symbol is bound
  int version = 0;
  int (*get_version)(int*) = nullptr;
  int (*comm_init_all)(Comm*, int, const int*) = nullptr;
  int (*comm_destroy)(Comm) = nullptr;
  int (*all_reduce)(const void*, void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  const char* (*error_string)(int) = nullptr;
};

// Loaded once per process; check `error` before use.
const Api& api();

// Throws Error(backend) "<what> failed: <NCCL's message>" for a result other than ncclSuccess.
void check_result(int result, const char* what);

// ncclDataType_t of bf16, f16 or f32; any other dtype throws an argument error naming `op`.
int dtype_code(DType t, const char* op);

// "NCCL 2.x.y" or the reason it cannot be loaded.
std::string describe();

}  // namespace opforge::cuda::nccl
