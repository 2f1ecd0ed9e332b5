// opforge perfdb validate|show|query: the performance database (data/perf/<system>/<op>.csv).
//   validate --system S [--root DIR] [--interp floor|cubic|linear] [--points FILE]
//                                      leave-one-out per op: interior points, median and p90
//                                      relative error, PASS when median <= 3% and p90 <= 8% (the
//                                      exit status is 0 either way; a malformed file is an error,
//                                      status 2); beside it the plain log-log linear rule on the
//                                      same points, and the grid ends (beyond, below) by
//                                      extrapolation, apart from the goal
//   show --system S [--op OP]          each table's header, dims, impls, dtypes and row count
//   query --system S --op OP [--impl auto] [--dtype bf16] [--interp floor|cubic|linear] --dim NAME=VALUE ...
//                                      the answer and how it was obtained
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>

#include "opforge/error.h"
#include "opforge/perfdb.h"
#include "tools/cli.h"

namespace opforge::cli {

namespace {

constexpr double kGoalMedian = 0.03;
constexpr double kGoalP90 = 0.08;

struct PerfdbFlags {
  std::string system, root, op, impl = "auto", dtype = "bf16", interp = "floor", points;
  std::vector<std::string> dims;
};

void add_system_flags(CLI::App& cmd, PerfdbFlags& f) {
  cmd.add_option("--system", f.system, "the system's folder name under the perf data root")->required();
  cmd.add_option("--root", f.root,
                 "perf data folder (holding <system>/) or a checkout holding data/perf "
                 "(default: $OPFORGE_PERF_DATA, else data/perf above the executable or the current folder, "
                 "else the installed share/opforge/perf)");
}

void add_interp_flag(CLI::App& cmd, PerfdbFlags& f) {
  cmd.add_option("--interp", f.interp, kInterpHelp)->check(CLI::IsMember({"floor", "cubic", "linear"}));
}

perfdb::Database load_db(const PerfdbFlags& f) {
  perfdb::Database db = perfdb::Database::load(f.system, f.root);
  db.set_interpolation(interpolation_named(f.interp));
  return db;
}

std::string pct(const perfdb::ValidationStats& s, bool p90) {
  if (s.points == 0) return "-";
  return fmt::format("{:.2f}%", 100 * (p90 ? s.p90_rel_err : s.median_rel_err));
}

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

perfdb::Dims parse_dims(const std::vector<std::string>& specs) {
  perfdb::Dims dims;
  for (const std::string& s : specs) {
    size_t eq = s.find('=');
    int64_t v = 0;
    const char* begin = eq == std::string::npos ? nullptr : s.data() + eq + 1;
    const char* end = s.data() + s.size();
    auto [p, ec] = begin ? std::from_chars(begin, end, v) : std::from_chars_result{nullptr, std::errc::invalid_argument};
    if (eq == std::string::npos || eq == 0 || ec != std::errc() || p != end)
      throw Error(ErrorCode::parse, "--dim expects NAME=INTEGER, got '" + s + "'");
    if (!dims.emplace(s.substr(0, eq), v).second)
      throw Error(ErrorCode::parse, "--dim " + s.substr(0, eq) + " given twice");
  }
  return dims;
}

// Every interior prediction, one CSV line each (op, where, predicted, measured, relative error),
// for finding where an op's p90 comes from.
void write_points(const std::string& path, const std::vector<perfdb::ValidationRow>& rows) {
  std::ofstream out(path);
  if (!out) throw Error(ErrorCode::io, "perfdb validate: cannot write --points file '" + path + "'");
  out << "op,where,predicted_us,measured_us,rel_err\n";
  for (const perfdb::ValidationRow& v : rows)
    for (const perfdb::ValidationPoint& p : v.interior)
      out << fmt::format("{},\"{}\",{:.6g},{:.6g},{:.6f}\n", v.op, p.where, p.predicted_us, p.measured_us,
                         std::abs(p.predicted_us - p.measured_us) / p.measured_us);
  if (!out) throw Error(ErrorCode::io, "perfdb validate: writing '" + path + "' failed");
  std::cout << fmt::format("every interior prediction: {}\n", path);
}

void run_validate(const PerfdbFlags& f) {
  perfdb::Database db = load_db(f);
  std::cout << fmt::format("perf data of system '{}' ({}): leave-one-out along the axes\n", f.system, db.folder());
  std::cout << fmt::format("interior points, interpolated ({}); goal: median <= {:.0f}%, p90 <= {:.0f}%\n",
                           perfdb::interpolation_name(db.interpolation()), kGoalMedian * 100, kGoalP90 * 100);
  std::cout << "beside them: the same points by the plain rule (linear in log-log between the two neighbours);\n"
               "apart from the goal, the last and first row of each line extrapolated from its neighbour (roofline\n"
               "fraction held): beyond the grid and below it\n\n";
  std::cout << fmt::format("{:<26} {:>6} {:>8} {:>8}  {:<4}  {:>8} {:>8}  {:>4} {:>8} {:>8}  {:>4} {:>8} {:>8}\n", "",
                           "", "", "", "", "linear", "linear", "", "beyond", "beyond", "", "below", "below");
  std::cout << fmt::format("{:<26} {:>6} {:>8} {:>8}  {:<4}  {:>8} {:>8}  {:>4} {:>8} {:>8}  {:>4} {:>8} {:>8}  {}\n",
                           "op", "points", "median", "p90", "goal", "median", "p90", "n", "median", "p90", "n", "median",
                           "p90", "worst interior point");
  int pass = 0, fail = 0;
  const std::vector<perfdb::ValidationRow> rows = perfdb::leave_one_out(db);
  for (const perfdb::ValidationRow& v : rows) {
    std::string ends = fmt::format("{:>4} {:>8} {:>8}  {:>4} {:>8} {:>8}", v.beyond.points, pct(v.beyond, false),
                                   pct(v.beyond, true), v.below.points, pct(v.below, false), pct(v.below, true));
    if (v.points == 0) {
      std::cout << fmt::format("{:<26} {:>6} {:>8} {:>8}  {:<4}  {:>8} {:>8}  {}  n/a (no interior points)\n", v.op,
                               0, "-", "-", "n/a", "-", "-", ends);
      continue;
    }
    bool ok = v.median_rel_err <= kGoalMedian && v.p90_rel_err <= kGoalP90;
    (ok ? pass : fail)++;
    std::cout << fmt::format("{:<26} {:>6} {:>7.2f}% {:>7.2f}%  {:<4}  {:>8} {:>8}  {}  {:.1f}%: {}\n", v.op, v.points,
                             v.median_rel_err * 100, v.p90_rel_err * 100, ok ? "PASS" : "FAIL",
                             pct(v.log_linear, false), pct(v.log_linear, true), ends, v.max_rel_err * 100, v.worst);
  }
  std::cout << fmt::format("\n{} op(s) PASS, {} FAIL\n", pass, fail);
  if (!f.points.empty()) write_points(f.points, rows);
  bool header = false;
  for (const perfdb::ValidationRow& v : rows) {
    if (v.both_axes.points == 0) continue;
    if (!header)
      std::cout << "\nboth axes inside (2-axis tables: a row predicted with its whole first- and second-axis values "
                   "left out),\nby the rule above / by the plain rule (bilinear in the logs of the four corners):\n";
    header = true;
    std::cout << fmt::format("{:<26} {:>6} {:>8} {:>8}  /  {:>8} {:>8}  {:.1f}%: {}\n", v.op, v.both_axes.points,
                             pct(v.both_axes, false), pct(v.both_axes, true), pct(v.both_axes_plain, false),
                             pct(v.both_axes_plain, true), v.both_axes.max_rel_err * 100, v.both_axes.worst);
  }
}

void run_show(const PerfdbFlags& f) {
  perfdb::Database db = load_db(f);
  std::vector<std::string> ops = f.op.empty() ? db.ops() : std::vector<std::string>{f.op};
  std::cout << fmt::format("system '{}' ({}): {} op(s)\n", f.system, db.folder(), db.ops().size());
  for (const std::string& op : ops) {
    const perfdb::OpTable& t = db.table(op);
    const perfdb::FileHeader& h = t.header;
    std::set<std::string> impls, dtypes;
    size_t with_energy = 0;
    for (const perfdb::Row& r : t.rows) {
      impls.insert(r.impl);
      dtypes.insert(r.dtype);
      with_energy += r.energy_uj.has_value();
    }
    std::string dims, axes;
    for (const std::string& d : t.dim_names) dims += (dims.empty() ? "" : ", ") + d;
    for (const std::string& a : h.axes) axes += (axes.empty() ? "" : ", ") + a;
    std::cout << fmt::format("\n{}  ({})\n", op, t.path);
    std::cout << fmt::format("  device: {}\n  commit: {}  date: {}\n", h.device, h.commit, h.date);
    std::cout << fmt::format("  ceilings: {} GB/s, {} GFLOP/s\n", h.ceiling_gbps, h.ceiling_gflops);
    std::cout << fmt::format("  dims: {}  (axes: {})\n", dims, axes);
    for (const auto& [k, v] : h.extra) std::cout << fmt::format("  {}: {}\n", k, v);
    std::cout << fmt::format("  rows: {} ({} with energy)  impls: {}  dtypes: {}\n", t.rows.size(), with_energy,
                             join(impls), join(dtypes));
  }
}

void run_query(const PerfdbFlags& f) {
  perfdb::Database db = load_db(f);
  perfdb::Dims dims = parse_dims(f.dims);
  perfdb::Answer a = db.query(f.op, f.impl, f.dtype, dims);
  std::string at;
  for (const std::string& d : db.table(f.op).dim_names) at += fmt::format("{}{}={}", at.empty() ? "" : " ", d, dims.at(d));
  std::cout << fmt::format("{} [{}] {} on {}: {}\n", f.op, a.impl, f.dtype, f.system, at);
  std::cout << fmt::format("  time:   {:.4g} us\n", a.us);
  if (a.energy_uj) std::cout << fmt::format("  energy: {:.4g} uJ\n", *a.energy_uj);
  std::cout << fmt::format("  method: {}\n  how:    {}\n", perfdb::method_name(a.method), a.how);
}

}  // namespace

void add_perfdb(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("perfdb", "the performance database: validate, show, query");
  cmd->require_subcommand(1);
  auto flags = std::make_shared<PerfdbFlags>();

  auto* validate = cmd->add_subcommand("validate", "leave-one-out error per op against the goal (median <= 3%, p90 <= 8%)");
  add_system_flags(*validate, *flags);
  add_interp_flag(*validate, *flags);
  validate->add_option("--points", flags->points, "also write every interior prediction to this CSV file");
  validate->callback([flags, &status] { run_validate(*flags); status = 0; });

  auto* show = cmd->add_subcommand("show", "headers and row counts of a system's tables");
  add_system_flags(*show, *flags);
  show->add_option("--op", flags->op, "only this op");
  show->callback([flags, &status] { run_show(*flags); status = 0; });

  auto* query = cmd->add_subcommand("query", "the time of one op call, and how it was obtained");
  add_system_flags(*query, *flags);
  query->add_option("--op", flags->op, "op name")->required();
  query->add_option("--impl", flags->impl, "impl name, or auto for the fastest that can answer (default auto)");
  query->add_option("--dtype", flags->dtype, "dtype (default bf16)");
  add_interp_flag(*query, *flags);
  query->add_option("--dim", flags->dims, "NAME=VALUE for every dim of the op (repeatable)");
  query->callback([flags, &status] { run_query(*flags); status = 0; });
}

}  // namespace opforge::cli
