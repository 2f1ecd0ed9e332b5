// Threading of the CPU kernels: OpenMP over independent tasks.
//
// Tasks come from Note [tiling] (backends/cpu/tiling.h); a task is a block of rows or of elements.
// One task runs on the calling thread with no OpenMP region at all, so small calls (decode: one
// token) pay no fork/join. Static scheduling hands each thread one contiguous run of tasks, which
// keeps neighbouring rows on one core. `run_task` must not throw (kernels validate nothing: the
// op's check ran before).
#pragma once

#include <cstdint>

namespace opforge::cpu {

template <class F> void parallel_tasks(int64_t n_tasks, F&& run_task) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1) {
    run_task(int64_t(0));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < n_tasks; ++task) run_task(task);
}

}  // namespace opforge::cpu
