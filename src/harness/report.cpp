// Harness output: terminal table, JSON, CSV, and the support matrix.
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "opforge/error.h"
#include "opforge/harness.h"

namespace opforge {

const char* case_group_name(CaseGroup g) {
  switch (g) {
    case CaseGroup::small: return "small";
    case CaseGroup::medium: return "medium";
    case CaseGroup::large: return "large";
    case CaseGroup::edge: return "edge";
    case CaseGroup::training: return "training";
  }
  return "?";
}

namespace harness {

std::string format_table(const Report& rep) {
  std::string out;
  bool perf = !rep.results.empty() && rep.results.front().mode == "perf";
  if (perf) {
    out += fmt::format("copy ceiling: cpu {:.1f} GB/s", rep.cpu_copy_gbps);
    if (rep.cuda_copy_gbps > 0) out += fmt::format(", cuda {:.1f} GB/s ({})", rep.cuda_copy_gbps, rep.cuda_device_name);
    out += fmt::format("  [{}]\n", rep.date);
    out += fmt::format("{:<28} {:<10} {:<7} {:<5} {:<18} {:<6} {:>11} {:>9} {:>9} {:>7}\n", "op", "impl", "device",
                       "dtype", "case", "group", "median us", "GB/s", "GFLOP/s", "% copy");
    for (const Result& r : rep.results) {
      if (r.status != Status::pass) {
        out += fmt::format("{:<28} {:<10} {:<7} {:<5} {:<18} {:<6} {}: {}\n", r.op, r.impl, r.device, r.dtype,
                           r.case_label, r.group, status_name(r.status), r.detail);
        continue;
      }
      out += fmt::format("{:<28} {:<10} {:<7} {:<5} {:<18} {:<6} {:>11.2f} {:>9.1f} {:>9.1f} {:>6.1f}%\n", r.op,
                         r.impl, r.device, r.dtype, r.case_label, r.group, r.median_us, r.gbps, r.gflops,
                         r.pct_ceiling);
    }
    return out;
  }
  if (rep.fuzz > 0)
    out += fmt::format("fuzz: {} draws per op, seed {} (Note [fuzz derivation]; the same seed and op give the "
                       "same draws)\n",
                       rep.fuzz, rep.fuzz_seed);
  out += fmt::format("{:<5} {:<28} {:<10} {:<7} {:<5} {:<16} {:<6} {:<5} {}\n", "mode", "op", "impl", "device",
                     "dtype", "case", "group", "", "detail");
  for (const Result& r : rep.results)
    out += fmt::format("{:<5} {:<28} {:<10} {:<7} {:<5} {:<16} {:<6} {:<5} {}\n", r.mode, r.op, r.impl, r.device,
                       r.dtype, r.case_label, r.group, status_name(r.status), r.detail);
  out += fmt::format("\n{} passed, {} failed, {} skipped (not applicable)\n", rep.count(Status::pass),
                     rep.count(Status::fail), rep.count(Status::skip));
  if (rep.fuzz > 0) {
    // Per draw (mode, op, case): rejected when the reference refused it, failed when any kernel
    // failed on it, checked otherwise.
    std::map<std::tuple<std::string, std::string, std::string>, std::pair<bool, bool>> draws;
    for (const Result& r : rep.results) {
      auto& [rejected, failed] = draws[{r.mode, r.op, r.case_label}];
      rejected |= r.rejected;
      failed |= r.status == Status::fail;
    }
    int rejected = 0, failed = 0;
    for (const auto& [key, d] : draws) {
      rejected += d.first;
      failed += d.second;
    }
    out += fmt::format("fuzz draws: {} checked, {} rejected (by the reference), {} failed\n",
                       int(draws.size()) - rejected, rejected, failed);
  }
  return out;
}

static std::ofstream open_out(const std::string& path) {
  std::ofstream f(path);
  if (!f) throw Error(ErrorCode::io, "cannot write " + path);
  return f;
}

void write_json(const Report& rep, const std::string& path) {
  nlohmann::json doc{{"date", rep.date}, {"cpu_copy_gbps", rep.cpu_copy_gbps},
                     {"cuda_copy_gbps", rep.cuda_copy_gbps}, {"cuda_device", rep.cuda_device_name}};
  if (rep.fuzz > 0) {
    doc["fuzz"] = rep.fuzz;
    doc["fuzz_seed"] = rep.fuzz_seed;
  }
  nlohmann::json results = nlohmann::json::array();
  for (const Result& r : rep.results)
    results.push_back({{"mode", r.mode}, {"op", r.op}, {"impl", r.impl}, {"device", r.device},
                       {"dtype", r.dtype}, {"case", r.case_label}, {"group", r.group},
                       {"status", status_name(r.status)}, {"detail", r.detail},
                       {"max_abs_err", r.max_abs_err}, {"nmse", r.nmse}, {"median_us", r.median_us},
                       {"gbps", r.gbps}, {"gflops", r.gflops}, {"pct_ceiling", r.pct_ceiling},
                       {"bytes", r.bytes}, {"flops", r.flops}, {"rejected", r.rejected}});
  doc["results"] = results;
  open_out(path) << doc.dump(2) << "\n";
}

static std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void write_csv(const Report& rep, const std::string& path) {
  std::ofstream f = open_out(path);
  f << "mode,op,impl,device,dtype,case,group,status,max_abs_err,nmse,median_us,gbps,gflops,pct_ceiling,"
       "bytes,flops,detail\n";
  for (const Result& r : rep.results)
    f << fmt::format("{},{},{},{},{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{}\n", r.mode,
                     r.op, r.impl, r.device, r.dtype, csv_field(r.case_label), r.group, status_name(r.status),
                     r.max_abs_err, r.nmse, r.median_us, r.gbps, r.gflops, r.pct_ceiling, r.bytes, r.flops,
                     csv_field(r.detail));
}

std::string support_markdown(const Registry& reg) {
  std::set<std::string> impls;
  std::map<std::string, std::string> unavailable;
  for (const OpEntry* op : reg.ops())
    for (const KernelEntry& k : op->kernels) impls.insert(k.impl());
  std::string out = "# Operators and backends\n\nGenerated by `opforge support`; do not edit by hand. "
                    "Each cell lists the dtypes a kernel claims and the harness checks; "
                    "`-` marks an impl the op does not have.\n\n| op | backward |";
  for (const std::string& i : impls) out += " " + i + " |";
  out += "\n|---|---|";
  for (size_t i = 0; i < impls.size(); ++i) out += "---|";
  out += "\n";
  for (const OpEntry* op : reg.ops()) {
    out += "| `" + op->name + "` | " + (op->backward.empty() ? "" : "`" + op->backward + "`") + " |";
    for (const std::string& impl : impls) {
      std::string cell;
      for (const KernelEntry& k : op->kernels) {
        if (k.impl() != impl) continue;
        std::string dts;
        for (DType t : k.desc.dtypes) dts += (dts.empty() ? "" : ", ") + std::string(dtype_name(t));
        cell = dts.empty() ? "yes" : dts;
        if (!k.availability().ok) unavailable[k.impl() + " (" + device_kind_name(k.desc.device) + ")"] = k.availability().reason;
      }
      out += " " + (cell.empty() ? "-" : cell) + " |";
    }
    out += "\n";
  }
  if (!unavailable.empty()) {
    out += "\nNot available on the machine that generated this file (the harness checks them where they are):\n";
    for (const auto& [impl, why] : unavailable) out += "- " + impl + ": " + why + "\n";
  }
  out += "\n## Definitions\n\n";
  for (const OpEntry* op : reg.ops()) out += "- `" + op->signature + "`: " + op->doc + "\n";
  return out;
}

}  // namespace harness
}  // namespace opforge
