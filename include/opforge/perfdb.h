// The performance database: per-op timings collected by `opforge collect`, one CSV per op and
// system, and a query that answers with a latency and says how it got it.
//
// Layout:  data/perf/<system>/<op>.csv
//
//   # opforge-perfdb 1                        format version (first line, required)
//   # system: cpu-epyc-2c                     the name given to `opforge collect --system`
//   # op: rms_norm
//   # device: AMD EPYC 7B12 (2 threads)       what ran it (CUDA: the card's name)
//   # commit: 20d968a                         opforge's git commit ("unknown" outside a checkout)
//   # date: 2026-11-26                        ISO date of the collection
//   # ceiling_gbps: 23.8                      copy bandwidth measured in the same run
//   # ceiling_gflops: 180.5                   dense-GEMM peak measured in the same run (0: none)
//   # axes: tokens                            the interpolation axes (1 or 2 dims, see below)
//   impl,dtype,<dim>...,median_us,bytes,flops,energy_uj,plan
//   cpu,bf16,1,4096,0.91,16392,24576,,stream-8192/67108864;threads-24576/65536
//   ...
//
// Columns after `dtype` up to `median_us` are the op's grid dims (integers, named in the column
// header; perfdb::op_dims lists them per op). `bytes` and `flops` are the op's cost model at that
// point; `energy_uj` (micro-joules per call) is empty when power was not sampled. `plan` (an
// optional last column; files collected before it have none) holds the decisions the kernel
// noted at that point, key+value/threshold or key-value/threshold separated by ';' (Note [plan
// regimes] in opforge/plan.h); empty when it noted none.
//
// Query rule (Database::query):
//   - impl "auto" answers with the fastest impl that can answer; any other impl must match exactly.
//   - Every dim that is not an axis is matched exactly where the impl has rows of that shape;
//     otherwise two stored shapes bracketing it in one dim (interpolated, log-log), else the
//     stored shape within 4x on each such dim that is nearest in roofline time answers, scaled by
//     the ratio of the shapes' roofline times (extrapolated; Note [shapes off the grid] in
//     src/perfdb/database.cpp). "auto" prefers impls holding the query's shape.
//   - measured:     the point is stored.
//   - interpolated: inside the grid along the axes. Along one axis (a 1-axis table, or a 2-axis
//                   table with the other axis on a stored value): by default time = a + b * axis^p
//                   (a fixed cost plus a power law, a >= 0) through the two neighbours and the
//                   next stored point on either side (Note [fixed cost plus power law] in
//                   src/perfdb/internal.h), else a monotone cubic in log(time) over log(axis)
//                   through every stored point of that line (PCHIP, Note [monotone cubic in
//                   log-log]); with Interpolation::log_linear, or when the line holds only the two
//                   neighbours, log(time) linear in log(axis) between the two neighbouring stored
//                   values. All pass through the stored points, reproduce a power law exactly and
//                   stay between the neighbours' times on monotone data; the first two follow the
//                   bend of a launch floor into a bandwidth slope. Where the rows carry plans,
//                   only the rows of the query's plan take part, and a query past a plan switch
//                   continues its side's rows (Note [plan lines] in src/perfdb/internal.h); rows
//                   split over the device's T threads go by the busiest thread's ceil(axis / T)
//                   rows, unless the table's rows vote for the axis (Note [busiest thread's rows]
//                   in src/perfdb/internal.h). On two axes
//                   both inside (the four corners must all be stored): the one-axis rule along
//                   the second axis on every stored line of the first that brackets the query,
//                   then along the first (Note [two axes by lines] in src/perfdb/database.cpp);
//                   with Interpolation::log_linear, bilinear in the logs of the corners. On
//                   2 axes an axis whose query value is stored may instead be held there, the
//                   other bracketed along that line.
//   - extrapolated: beyond the largest (or below the smallest) stored value of an axis, by at most
//                   4x: the achieved fraction of the roofline at the nearest stored point is held
//                   constant, roofline time = max(bytes / ceiling_gbps, flops / ceiling_gflops)
//                   with bytes and flops from the op's cost model at the query point.
//   - anything else throws PerfDataNotAvailable naming what is missing (system, op, impl, dtype,
//     or the dims and the nearest stored ones); an answer never comes from another op's data.
//     A non-axis dim more than 4x from every stored shape is not available.
// Queries never write: files are read once by Database::load.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "opforge/error.h"
#include "opforge/op.h"
#include "opforge/plan.h"

namespace opforge::perfdb {

inline constexpr int kFormatVersion = 1;

// Named integer dims of one op call, e.g. {{"tokens", 1024}, {"hidden", 4096}}.
using Dims = std::map<std::string, int64_t>;

class PerfDataNotAvailable : public Error {
 public:
  explicit PerfDataNotAvailable(const std::string& message)
      : Error(ErrorCode::not_available, message) {}
};

struct FileHeader {
  int version = kFormatVersion;
  std::string system, op, device, commit, date;
  double ceiling_gbps = 0;
  double ceiling_gflops = 0;
  std::vector<std::string> axes;  // 1 or 2 names, each one of the dims
  // Any other "# key: value" lines (e.g. what the collector wants to record), kept and rewritten.
  std::map<std::string, std::string> extra;
};

struct Row {
  std::string impl;
  std::string dtype;  // dtype_name(): f32, bf16, f16, ...
  Dims dims;
  double median_us = 0;
  double bytes = 0;
  double flops = 0;
  std::optional<double> energy_uj;
  // The kernel's decisions at this point (Note [plan regimes] in opforge/plan.h); empty
  // when none were noted or the file has no plan column.
  std::vector<plan::Decision> plan;
};

// A machine's ceilings as a collection measures them (Note [collection ceilings] in
// src/perfdb/collect.cpp): copy bandwidth and the GEMM peak of its fastest linear kernel; 0 where
// one is unknown. Every table's header holds those of its run; perfdb::measure_ceilings
// (opforge/collect.h) measures them again, e.g. for the estimator's calibration.
struct Ceilings {
  double copy_gbps = 0;
  double gemm_gflops = 0;
  bool known() const { return copy_gbps > 0 || gemm_gflops > 0; }  // either one measured or given
};

struct OpTable {
  FileHeader header;
  std::vector<std::string> dim_names;  // column order
  std::vector<Row> rows;
  std::string path;
  bool has_plan = false;  // the file has the plan column (written when set or any row has a plan)
};

enum class Method { measured, interpolated, extrapolated, modelled };
const char* method_name(Method m);

// How a query interpolates along one axis (see the query rule above): a fixed cost plus a power
// law through the neighbours and the next point on either side, where one fits, else the monotone
// cubic in log-log (the default); the monotone cubic in log-log alone; or log time linear in log
// axis between the two neighbours (the plain rule).
enum class Interpolation { floor_power, monotone_cubic, log_linear };
// "fixed cost plus power law", "monotone cubic in log-log", "linear in log-log"
const char* interpolation_name(Interpolation m);

struct Answer {
  double us = 0;
  std::optional<double> energy_uj;
  Method method = Method::measured;
  std::string impl;  // the impl that answered (useful with "auto")
  std::string how;   // e.g. "interpolated in tokens between 512 and 1024 (fixed cost plus power law)"
  // Non-empty when the kernel whose rows answered cannot run the query's shape (Note [kernels
  // that cannot run the shape] in src/perfdb/database.cpp): the kernel that would run it, or "".
  // `impl` then reads "<that kernel> (data: <measured impl>)".
  std::optional<std::string> stand_in_for;
};

// Write one table (header lines, column header, rows) to `path`; `append_rows` adds rows to an
// existing file with the same header (used by an interrupted collection that resumes).
void write_table(const OpTable& table, const std::string& path);
void append_rows(const std::string& path, const std::vector<std::string>& dim_names,
                 const std::vector<Row>& rows);
// Read and validate one file; a malformed line is an Error naming the file and line number.
OpTable read_table(const std::string& path);
// The same on a file's text; `path` only names it in errors.
OpTable parse_table(const std::string& text, const std::string& path);

// The op's cost model as the extrapolation uses it; Database's default is perfdb::cost_at.
using CostFn = std::function<Cost(const std::string& op, const std::string& dtype, const Dims& dims)>;

// Whether a kernel can run a shape, as queries check it: why `impl` refuses the call of `op` at
// `dims` in `dtype` (its predicate's reason), or "" when it takes it or this build cannot tell
// (no such kernel registered here, no predicate). Database's default is perfdb::kernel_refusal.
using RefusalFn = std::function<std::string(const std::string& op, const std::string& impl,
                                            const std::string& dtype, const Dims& dims)>;
std::string kernel_refusal(const std::string& op, const std::string& impl, const std::string& dtype,
                           const Dims& dims);
// The kernel the registry would run for that call on the device `impl` belongs to: the first
// non-reference kernel of that device, highest priority first, whose predicate takes the shape;
// "" when none does or this build cannot tell. `refusal` as above (the default when empty).
std::string kernel_that_runs(const std::string& op, const std::string& impl, const std::string& dtype,
                             const Dims& dims, const RefusalFn& refusal = {});

class Database {
 public:
  // Every data/perf/<system>/*.csv under `root` (default: the data folder of this checkout or
  // install, or $OPFORGE_PERF_DATA). Throws PerfDataNotAvailable when the system has no folder.
  // `root` is the perf folder itself (holding <system>/) or a folder holding data/perf/; the
  // default search is Note [perf data root] in src/perfdb/database.cpp. Every file is validated
  // (read_table) and must name this system and, as its `op`, its file name.
  static Database load(const std::string& system, const std::string& root = "");
  // Systems with a folder under `root`.
  static std::vector<std::string> systems(const std::string& root = "");

  // The perf folder (holding <system>/ folders) that `root` stands for, as load() uses it.
  static std::string resolve_root(const std::string& root = "");

  const std::string& system() const { return system_; }
  const std::string& folder() const { return folder_; }  // <perf folder>/<system>
  bool has_op(const std::string& op) const { return tables_.count(op) != 0; }
  const OpTable& table(const std::string& op) const;  // throws PerfDataNotAvailable
  std::vector<std::string> ops() const;

  Answer query(const std::string& op, const std::string& impl, const std::string& dtype,
               const Dims& dims) const;

  // Replace the cost model used for extrapolation (an empty function restores perfdb::cost_at).
  void set_cost_model(CostFn fn) { cost_ = std::move(fn); }
  // Replace the check of whether a kernel can run a shape (empty: perfdb::kernel_refusal).
  void set_refusal_check(RefusalFn fn) { refusal_ = std::move(fn); }
  // How queries interpolate along one axis (default Interpolation::floor_power).
  void set_interpolation(Interpolation m);
  Interpolation interpolation() const { return interp_; }

 private:
  std::string system_;
  std::string folder_;
  std::map<std::string, OpTable> tables_;
  CostFn cost_;
  RefusalFn refusal_;
  Interpolation interp_ = Interpolation::floor_power;
  // (op, axis, impl) whose rows follow the busiest thread's rows (Note [busiest thread's rows] in
  // src/perfdb/internal.h), voted by their own rows under interp_.
  std::set<std::tuple<std::string, std::string, std::string>> busiest_;
  void vote_busiest();
};

// ---- model-shaped grids (src/perfdb/grid.cpp) ----------------------------------------------
// The ops the collector and the estimator know: their dims in column order and their axes.
struct OpGrid {
  std::string op;
  std::vector<std::string> dims;
  std::vector<std::string> axes;
};
const std::vector<OpGrid>& known_ops();
const OpGrid& op_grid(const std::string& op);  // throws Error(unknown_name) listing known_ops()
// The harness case of `op` at `dims` (every dim of op_grid(op) given, else Error).
Case case_at(const std::string& op, const Dims& dims);
// The op's own cost model at `dims`, without allocating the tensors.
Cost cost_at(const std::string& op, const std::string& dtype, const Dims& dims);

// Leave-one-out over the stored grid (Note [leave-one-out] in src/perfdb/validate.cpp): along each
// axis, every row with stored neighbours on both sides of its line is predicted from the rest of
// the line by the database's interpolation, as a query would if the row were not stored; relative
// errors per op. The same interior rows are also predicted by the plain log-log linear rule, for
// comparison, and the two ends of each line (an extrapolation test, not part of the goal) apart.
struct ValidationStats {
  int points = 0;
  double median_rel_err = 0;
  double p90_rel_err = 0;
  double max_rel_err = 0;
  std::string worst;  // the prediction with max_rel_err, e.g. "cpu bf16 tokens=48, hidden=4096 along tokens"
};
// One interior prediction of leave_one_out, for a per-point listing (`perfdb validate --points`).
struct ValidationPoint {
  std::string where;  // as ValidationStats::worst: "impl dtype dims along axis"
  double predicted_us = 0;
  double measured_us = 0;
};
struct ValidationRow {
  std::string op;
  std::vector<ValidationPoint> interior;  // every interior prediction behind the numbers below
  // interior rows, by Database::interpolation()
  int points = 0;
  double median_rel_err = 0;
  double p90_rel_err = 0;
  double max_rel_err = 0;
  std::string worst;
  ValidationStats log_linear;  // the same rows by Interpolation::log_linear
  // The last (beyond) and first (below) row of each line (>= 2 rows), predicted from its neighbour
  // on the line holding the roofline fraction (the query's extrapolation rule), when at most 4x away.
  ValidationStats beyond, below;
  // 2-axis tables: each row inside both axes predicted with its whole first-axis value and
  // second-axis value left out, so that both axes are inside as for a query between grid values on
  // both: by the database's interpolation (Note [two axes by lines]) and by the plain rule
  // (bilinear in the logs of the four corners); rows whose corners are not all stored are skipped.
  ValidationStats both_axes, both_axes_plain;
};
std::vector<ValidationRow> leave_one_out(const Database& db);

}  // namespace opforge::perfdb
