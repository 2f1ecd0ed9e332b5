// The verification and measurement harness: one program, four modes over the same per-op cases.
//
//   test     every available kernel x dtype x case against the reference evaluated in f64
//   grad     the reference backward against central finite differences of the reference forward
//            (f64), and every backward kernel against the reference backward
//   perf     median us, GB/s, GFLOP/s and % of the copy ceiling measured in the same run
//   support  the op x backend matrix (docs/ops.md)
//
// Note [poison and guards]: every output a kernel writes lives in a buffer whose bytes outside the
// view's elements (guard regions before and after, gaps between padded rows) hold a sentinel
// pattern, and whose elements start as a NaN with a recognisable payload. After the call, a changed
// sentinel byte is an out-of-bounds write, a surviving poison payload an unwritten element, and
// inputs are compared byte for byte with their copies (a kernel must not write its inputs).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "opforge/policy.h"
#include "opforge/registry.h"

namespace opforge::harness {

struct Options {
  std::vector<std::string> ops;      // empty: every op
  std::vector<std::string> backends; // impl names or device kinds (cpu, cuda); empty: all
  // Only kernels this policy could run (its candidates per op and device); default "all" = every
  // available kernel. `-rms_norm` restricts rms_norm to its reference, `rms_norm=cpu` to cpu.
  Policy policy;
  std::vector<DType> dtypes;         // empty: every dtype each kernel claims
  std::vector<CaseGroup> groups;     // empty: test/grad small+medium+edge, perf small+medium+large (never training)
  std::vector<std::string> cases;    // case labels (exact); empty: every case of the chosen groups.
                                     // A label chosen here runs whatever its group.
  uint64_t seed = 20261125;
  int cuda_device = 0;
  // perf: each sample is timed, samples repeat until both bounds are met, median is reported.
  int perf_min_samples = 5;
  int perf_max_samples = 50;
  double perf_min_seconds = 0.05;
  double perf_max_seconds = 5.0;     // host timing stops here once it has 3 samples (slow kernels)
  // Note [cold operands]: > 0: perf mode cycles through copies of the arguments whose inputs add
  // up to at least this many bytes (at most 16 copies), so each timed call finds its operands out
  // of the last-level cache (a GPU's L2, a CPU's L3), as a layer's weights and KV cache are. 0:
  // every call reuses one set (operands that fit the cache stay there).
  int64_t perf_rotate_bytes = 0;
  bool perf_reference = true;        // time reference kernels too (slow on large cases)
  bool progress = false;             // one updating line on stderr
  // Shard shard_index of shard_count: only the ops whose name hashes (FNV-1a, so every run and
  // machine splits alike) to this shard, so a long check can run as parallel processes.
  int shard_index = 0;
  int shard_count = 1;
  // check --fuzz N: N random cases per op derived from its declared ones (Note [fuzz derivation],
  // src/harness/fuzz.cpp) replace the declared cases; fuzz_seed fixes the draws.
  int fuzz = 0;
  uint64_t fuzz_seed = 20261204;
};

enum class Status { pass, fail, skip };
const char* status_name(Status s);

struct Result {
  std::string mode;   // test, grad, perf
  std::string op;
  std::string impl;
  std::string device;
  std::string dtype;
  std::string case_label;
  std::string group;
  Status status = Status::pass;
  std::string detail;       // why it failed or was skipped, or what was compared
  double max_abs_err = 0;   // test/grad
  double nmse = 0;
  double median_us = 0;     // perf
  double gbps = 0;
  double gflops = 0;
  double pct_ceiling = 0;
  double bytes = 0;
  double flops = 0;
  double energy_uj = -1;    // perf_case with an energy reader on a device: per call; < 0: none
  bool rejected = false;    // fuzz: the reference rejected the draw (a pass: the kernel did too)
};

struct Report {
  std::vector<Result> results;
  double cpu_copy_gbps = 0;   // measured in the same run (perf)
  double cuda_copy_gbps = 0;
  std::string cuda_device_name;
  std::string date;           // ISO date of the run
  int fuzz = 0;               // fuzz draws per op (0: the declared cases), and their seed
  uint64_t fuzz_seed = 0;
  int count(Status s) const;
  bool ok() const { return count(Status::fail) == 0; }
};

Report run_test(const Registry& reg, const Options& opt);
Report run_grad(const Registry& reg, const Options& opt);
Report run_perf(const Registry& reg, const Options& opt);
// The op x backend matrix as markdown (written to docs/ops.md by `opforge support`).
std::string support_markdown(const Registry& reg);

// One perf measurement of kernel `impl` of `op` on a case the caller built (the collector's grids),
// timed as run_perf times it; `ceiling_gbps` gives Result::pct_ceiling.
struct PerfExtras {
  const Cost* cost = nullptr;  // replaces the op's cost model evaluated on the call's arguments
  // A cumulative energy counter in millijoules (< 0: no reading). With it, a device kernel runs a
  // second timed batch of >= energy_seconds between two readings: Result::energy_uj.
  std::function<double()> energy_mj;
  double energy_seconds = 0.3;
};
Result perf_case(const Registry& reg, const Options& opt, const std::string& op,
                 const std::string& impl, const Case& c, DType dtype, double ceiling_gbps,
                 const PerfExtras& extras = {});

// Copy ceilings: a STREAM-like copy over OpenMP threads on the host, a device-to-device copy on
// CUDA; bytes read + bytes written over the median time, in GB/s (1e9).
double measure_cpu_copy_gbps(int64_t bytes = int64_t(1) << 29);
double measure_cuda_copy_gbps(int device_index, int64_t bytes = int64_t(1) << 30);

std::string format_table(const Report& report);
void write_json(const Report& report, const std::string& path);
void write_csv(const Report& report, const std::string& path);

}  // namespace opforge::harness
