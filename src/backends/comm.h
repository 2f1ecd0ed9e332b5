// Collective communication as the estimator needs it: the time of one all-reduce across `tp`
// GPUs of one host, measured through NCCL.
//
// A tensor-parallel model calls NCCL's all-reduce on buffers already resident on each GPU, so that
// is what is measured (the all_reduce op, ops/comm, runs the same NCCL calls on stacked ranks and
// adds the copies that layout needs). NCCL is loaded at run time (dlopen of $OPFORGE_NCCL_LIBRARY, else
// libnccl.so.2 from the loader's path), so neither the build nor a machine without it depends on
// it; without CUDA, NCCL or enough GPUs the call throws Error(not_available) saying which.
//
// Plain C++ header: the CUDA build implements it in src/backends/cuda/nccl_all_reduce.cpp, the
// build without CUDA in src/backends/without_cuda.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/dtype.h"

namespace opforge {

struct AllReducePoint {
  int tp = 0;              // ranks (one GPU each, devices 0 .. tp-1)
  int64_t bytes = 0;       // bytes of each rank's buffer
  double median_us = 0;    // slowest rank, median over samples
  double bus_gbps = 0;     // NCCL's bus bandwidth: 2 (tp-1)/tp * bytes / time
};

struct AllReduceSetup {
  std::vector<int> tps;          // e.g. {2, 4, 8}; degrees above the GPU count are skipped
  std::vector<int64_t> bytes;    // per-rank buffer sizes
  DType dtype = DType::bf16;
  int samples = 20;              // each sample times `calls` back-to-back all-reduces
  int calls = 10;
};

// The number of GPUs a measurement could use (0 without CUDA).
int comm_device_count();
// The NCCL library's version string, or the reason it cannot be loaded.
std::string nccl_describe();

// Measures every (tp, bytes) point of `setup` with tp <= comm_device_count(). Before timing each
// tp, one all-reduce of small integers is checked on the host (rank r holds r + 1, every rank must
// read tp (tp + 1) / 2), so a broken setup fails loudly instead of timing garbage.
std::vector<AllReducePoint> measure_nccl_all_reduce(const AllReduceSetup& setup);

}  // namespace opforge
