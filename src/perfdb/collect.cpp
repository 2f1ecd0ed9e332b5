// The collector (opforge/collect.h): ceilings once, then every kernel of the device over the
// grid of every op, one CSV row per point written as soon as it is measured.
//
// Note [collection ceilings]: the copy ceiling is the harness's (a STREAM-like copy over OpenMP
// threads on the host, a device-to-device copy on CUDA). The GEMM ceiling is the best GFLOP/s of
// the device's fastest linear kernel (the first available non-reference one in registry order, or
// --impl) on a square case, tokens = n = k = 2048 on the CPU and 8192 on a GPU, in the collection
// dtype: the dense-GEMM peak this build actually reaches, which is what the roofline of the
// estimator's extrapolation and the CPU grid cap need. 0 when the device has no linear kernel.
#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include <fmt/format.h>

#include "backends/cpu/cpu_info.h"
#include "harness/instance.h"
#include "opforge/collect.h"
#include "opforge/registry.h"
#include "perfdb/collect_internal.h"

namespace opforge::perfdb {

namespace {

using Clock = std::chrono::steady_clock;

std::string default_root() {
  const char* env = std::getenv("OPFORGE_PERF_DATA");
  return env && *env ? env : "data/perf";
}

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

std::string row_key(const std::string& impl, const std::string& dtype, const Dims& dims,
                    const std::vector<std::string>& order) {
  std::string k = impl;
  k += ',';
  k += dtype;
  for (const std::string& d : order) {
    k += ',';
    k += std::to_string(dims.at(d));
  }
  return k;
}

std::string dims_line(const OpGrid& g, const Dims& dims) {
  std::string s;
  for (const std::string& d : g.dims) s += (s.empty() ? "" : " ") + d + "=" + std::to_string(dims.at(d));
  return s;
}

std::string clock_text(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const long s = long(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// The kernels a collection times on the device: available, not the reference, in registry order.
std::vector<std::string> kernels_for(const OpEntry& op, const CollectOptions& opt) {
  std::vector<std::string> impls;
  for (const KernelEntry& k : op.kernels) {
    if (k.desc.device != opt.device || k.is_reference() || !k.availability().ok) continue;
    if (!opt.impls.empty() && std::find(opt.impls.begin(), opt.impls.end(), k.impl()) == opt.impls.end()) continue;
    impls.push_back(k.impl());
  }
  return impls;
}

// Note [samples on a shared CPU]: a CPU point is the median of kCpuSamples timed samples (each a
// batch of calls of >= 50 us; at most 5 s a point), not the harness's 5 to 50. On the 2-core Xeon
// VM, layer_norm at hidden 4,096 and 2-48 tokens (2-20 us a call) timed with 5-50 samples moved by
// up to 50% between two collections (8 tokens: 4.54 and 6.64 us; 16 tokens: 8.72 and 11.80), out
// of order with its neighbours, and no interpolation can follow that; with 400 samples three
// collections agreed within 5% and every line rose smoothly (docs/perf/estimator.md).
void set_point_samples(const CollectOptions& opt, harness::Options& ho) {
  constexpr int kCpuSamples = 400;
  const int samples = opt.samples > 0 ? opt.samples : opt.device == DeviceKind::cpu ? kCpuSamples : 0;
  if (samples > 0) {
    ho.perf_min_samples = samples;
    ho.perf_max_samples = std::max(samples, ho.perf_max_samples);
  }
}

// The machine's GEMM ceiling: its fastest linear kernel, the highest-priority one available on the
// device, whatever --impl selects for the collected ops (`--impl cuda` once measured linear's tiled
// fallback, 19 of the H200's 680 TFLOP/s).
double gemm_ceiling(const Registry& reg, const CollectOptions& opt, double copy_gbps) {
  const OpEntry* op = reg.find("linear");
  if (!op) return 0;
  const KernelEntry* best = nullptr;
  for (const KernelEntry& k : op->kernels) {
    if (k.desc.device != opt.device || k.is_reference() || !k.availability().ok) continue;
    if (!best || k.desc.priority > best->desc.priority) best = &k;
  }
  if (!best) return 0;
  const int64_t n = opt.device == DeviceKind::cpu ? 2048 : 8192;
  const Dims d{{"tokens", n}, {"n", n}, {"k", n}};
  harness::Options ho = opt.harness;
  ho.cuda_device = opt.device_index;
  set_point_samples(opt, ho);
  const Cost cost = cost_at("linear", opt.dtype, d);
  harness::PerfExtras extras;
  extras.cost = &cost;
  harness::Result r = harness::perf_case(reg, ho, "linear", best->impl(), case_at("linear", d),
                                         parse_dtype(opt.dtype), copy_gbps, extras);
  return r.status == harness::Status::pass ? r.gflops : 0;
}

double copy_ceiling(DeviceKind device, int index) {
  return device == DeviceKind::cpu ? harness::measure_cpu_copy_gbps() : harness::measure_cuda_copy_gbps(index);
}

struct Job {
  const OpGrid* grid;
  std::string path;
  Dims dims;
  std::string impl;
};

}  // namespace

std::string git_commit() {
  // A copy of the tree without its history (a lent GPU machine) is told its commit.
  if (const char* env = std::getenv("OPFORGE_COMMIT"); env && *env) return env;
  FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
  if (!p) return "unknown";
  char buf[128] = {0};
  std::string out = fgets(buf, sizeof buf, p) ? buf : "";
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

Ceilings measure_ceilings(const Registry& reg, DeviceKind device, int device_index, const std::string& dtype) {
  if (device != DeviceKind::cpu && !device_memory_ops(device))
    throw Error(ErrorCode::not_available, std::string("ceilings: this build has no ") + device_kind_name(device) + " backend");
  CollectOptions opt;
  opt.device = device;
  opt.device_index = device_index;
  opt.dtype = dtype;
  Ceilings c;
  c.copy_gbps = copy_ceiling(device, device_index);
  try {
    c.gemm_gflops = gemm_ceiling(reg, opt, c.copy_gbps);
  } catch (const std::exception&) {
    c.gemm_gflops = 0;  // no usable linear kernel: only the copy ceiling is known
  }
  return c;
}

std::string cpu_device_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, name = "unknown CPU";
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(" \t"));
        while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
      }
      break;
    }
  }
  const int threads = cpu::cpu_info().threads;
  return name + " (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)");
}

CollectSummary collect(const Registry& reg, const CollectOptions& opt) {
  auto notice = [&](const std::string& msg) {
    if (opt.notice) opt.notice(msg);
    else std::cerr << (opt.progress ? "\r\033[K" : "") << "opforge collect: " << msg << "\n";
  };
  const bool plain = !opt.system.empty() && opt.system[0] != '.' &&
                     std::all_of(opt.system.begin(), opt.system.end(), [](char ch) {
                       return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
                     });
  if (!plain)
    throw Error(ErrorCode::invalid_argument, "collect: --system must be a name of letters, digits, '_', "
                                             "'-' and '.' (a folder), got '" + opt.system + "'");
  const DType dtype = parse_dtype(opt.dtype);
  const std::string dtype_text = dtype_name(dtype);
  std::vector<std::string> ops = opt.ops;
  if (ops.empty())
    for (const OpGrid& g : known_ops()) ops.push_back(g.op);
  for (const std::string& op : ops) {
    op_grid(op);  // Error listing the known ops
    reg.op(op);   // Error when this build lacks it
  }
  for (const auto& [op, pts] : opt.points)
    for (const Dims& d : pts) case_at(op, d);  // Error naming a missing or extra dim
  for (const auto& [name, range] : opt.ranges) {
    std::set<std::string> dims;
    for (const std::string& op : ops)
      for (const std::string& d : op_grid(op).dims) dims.insert(d);
    if (!dims.count(name))
      throw Error(ErrorCode::invalid_argument,
                  "collect: range of '" + name + "', which is no dim of the ops collected (their dims: " +
                      detail::join_names(std::vector<std::string>(dims.begin(), dims.end())) + ")");
    if (range.first < 1 || range.first > range.second)
      throw Error(ErrorCode::invalid_argument, "collect: range of '" + name + "' is " + std::to_string(range.first) +
                                                   ":" + std::to_string(range.second) + ", expected 1 <= lo <= hi");
  }

  if (opt.device != DeviceKind::cpu && !opt.dry_run && !device_memory_ops(opt.device))
    throw Error(ErrorCode::not_available, std::string("collect: this build has no ") +
                                              device_kind_name(opt.device) + " backend");
  CollectSummary sum;
  const auto start = Clock::now();
  const std::string root = opt.root.empty() ? default_root() : opt.root;
  const std::string folder = root + "/" + opt.system;

  // Ceilings and the device, once.
  if (opt.progress) std::cerr << "\r\033[Kopforge collect: measuring the copy and GEMM ceilings" << std::flush;
  sum.ceiling_gbps = opt.copy_gbps > 0 ? opt.copy_gbps : copy_ceiling(opt.device, opt.device_index);
  if (opt.device == DeviceKind::cpu) {
    sum.device_name = cpu_device_name();
  } else {
    const DeviceMemoryOps* mem = device_memory_ops(opt.device);
    sum.device_name = mem && mem->device_name ? mem->device_name(opt.device_index) : device_kind_name(opt.device);
  }
  try {
    sum.ceiling_gflops = opt.gemm_gflops > 0 ? opt.gemm_gflops : gemm_ceiling(reg, opt, sum.ceiling_gbps);
  } catch (const std::exception& e) {
    notice(std::string("no GEMM ceiling (the linear kernel failed: ") + e.what() + "); ceiling_gflops 0");
  }
  std::function<double()> energy;
  if (opt.device != DeviceKind::cpu) {
    std::string why;
    energy = detail::nvml_energy_reader(opt.device_index, &why);
    if (!energy) notice("energy not sampled (" + why + "); the energy_uj column stays empty");
  }

  // Files: create, or resume one with the same identity.
  FileHeader header;
  header.system = opt.system;
  header.device = sum.device_name;
  header.commit = git_commit();
  header.date = harness::detail::today_iso();
  header.ceiling_gbps = sum.ceiling_gbps;
  header.ceiling_gflops = sum.ceiling_gflops;
  std::vector<Job> jobs;
  std::set<std::string> done;
  GridCap cap = default_cap(opt.device, sum.ceiling_gbps, sum.ceiling_gflops);
  cap.only_models = opt.models;
  cap.only_tp = opt.tp;
  cap.only_ranges = opt.ranges;
  GridCap uncapped;
  uncapped.only_models = opt.models;
  uncapped.only_tp = opt.tp;
  uncapped.only_ranges = opt.ranges;
  for (const std::string& op : ops) {
    const OpGrid& g = op_grid(op);
    std::vector<std::string> impls = kernels_for(reg.op(op), opt);
    if (impls.empty() && opt.dry_run) impls = {"(no kernel in this build)"};
    if (impls.empty()) {
      notice(op + ": no kernel on " + device_kind_name(opt.device) +
             (opt.impls.empty() ? std::string() : " among --impl " + detail::join_names(opt.impls)) + "; skipped");
      continue;
    }
    std::vector<Dims> pts;
    if (auto it = opt.points.find(op); it != opt.points.end()) {
      pts = it->second;
    } else {
      pts = grid_points(op, opt.grid, opt.device, cap, opt.dtype);
      sum.capped += int(grid_points(op, opt.grid, opt.device, uncapped, opt.dtype).size() - pts.size());
    }
    const std::string path = folder + "/" + op + ".csv";
    if (file_exists(path)) {
      OpTable t = read_table(path);
      const FileHeader& h = t.header;
      std::string why;
      if (h.version != kFormatVersion) why = "format version " + std::to_string(h.version);
      else if (h.system != opt.system) why = "system '" + h.system + "'";
      else if (h.op != op) why = "op '" + h.op + "'";
      else if (h.device != sum.device_name) why = "device '" + h.device + "'";
      else if (t.dim_names != g.dims) why = "dims " + detail::join_names(t.dim_names);
      if (!why.empty())
        throw Error(ErrorCode::invalid_argument,
                    "collect: " + path + " holds " + why + ", not what this run measures (system '" +
                        opt.system + "', op '" + op + "', device '" + sum.device_name +
                        "'); remove the file or pick another --system");
      if (opt.replace && !opt.dry_run) {
        std::set<std::string> selected;
        for (const Dims& d : pts)
          for (const std::string& impl : impls) selected.insert(row_key(impl, dtype_text, d, g.dims));
        const size_t before = t.rows.size();
        std::erase_if(t.rows, [&](const Row& r) { return selected.count(row_key(r.impl, r.dtype, r.dims, g.dims)) > 0; });
        if (t.rows.size() != before) {
          std::string& note = t.header.extra["recollected"];
          note += fmt::format("{}{} points on {} at commit {}, {} of them replacing stored rows (copy {:.1f} GB/s, "
                              "GEMM {:.1f} GFLOP/s)",
                              note.empty() ? "" : "; ", selected.size(), header.date, header.commit,
                              before - t.rows.size(), sum.ceiling_gbps, sum.ceiling_gflops);
          write_table(t, path);
        }
      }
      for (const Row& r : t.rows) done.insert(op + "," + row_key(r.impl, r.dtype, r.dims, g.dims));
    } else if (!opt.dry_run) {
      std::filesystem::create_directories(folder);
      OpTable t;
      t.header = header;
      t.header.op = op;
      t.header.axes = g.axes;
      t.dim_names = g.dims;
      t.has_plan = true;
      write_table(t, path);
    }
    sum.files.push_back(path);
    // One shape at a time along its axes, so that an interrupted run leaves whole token ranges.
    std::stable_sort(pts.begin(), pts.end(), [&](const Dims& a, const Dims& b) {
      auto key = [&](const Dims& d) {
        std::vector<int64_t> k;
        for (const std::string& n : g.dims)
          if (std::find(g.axes.begin(), g.axes.end(), n) == g.axes.end()) k.push_back(d.at(n));
        for (const std::string& n : g.axes) k.push_back(d.at(n));
        return k;
      };
      return key(a) < key(b);
    });
    for (const Dims& d : pts)
      for (const std::string& impl : impls) {
        if (done.count(op + "," + row_key(impl, dtype_text, d, g.dims))) {
          ++sum.already_present;
          continue;
        }
        jobs.push_back({&g, path, d, impl});
      }
  }

  if (opt.dry_run) {
    std::map<std::string, std::pair<int, double>> per_op;  // points, roofline seconds
    for (const Job& job : jobs) {
      const Cost c = cost_at(job.grid->op, opt.dtype, job.dims);
      auto& [n, sec] = per_op[job.grid->op];
      ++n;
      sec += std::max(sum.ceiling_gbps > 0 ? c.bytes / (sum.ceiling_gbps * 1e9) : 0.0,
                      sum.ceiling_gflops > 0 ? c.flops / (sum.ceiling_gflops * 1e9) : 0.0);
    }
    for (const auto& [op, v] : per_op)
      notice(op + ": " + std::to_string(v.first) + " measurements, roofline " + std::to_string(v.second) + " s per call sum");
    sum.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return sum;
  }

  // Measure, one row at a time. Each call finds its operands out of the last-level cache (Note
  // [cold operands] in opforge/harness.h): a model's weights and KV cache are not in it when its
  // layer reaches them, while the same few buffers timed back to back would be. GPU: 256 MiB of
  // copies (5x an H200's L2). CPU: 4x the L3; on the 2-core EPYC (8 MiB L3) the 128 expert GEMMs
  // of a Qwen3-30B-A3B layer (6 MiB of weights each) ran 25% slower in run-layer than rows timed
  // on one warm weight.
  harness::Options ho = opt.harness;
  ho.cuda_device = opt.device_index;
  set_point_samples(opt, ho);
  if (ho.perf_rotate_bytes == 0)
    ho.perf_rotate_bytes = opt.device != DeviceKind::cpu ? int64_t(256) << 20 : 4 * cpu::cpu_info().l3.bytes;
  // Note [passes over a line]: a shared VM's speed drifts over minutes (on the 2-core Xeon VM the
  // GEMM ceiling moved 93 -> 130 GFLOP/s within one collection), so points timed one after
  // another along a line can land in different periods and the line gets steps no interpolation
  // can follow (attention_decode: single points 25% apart between two collections). On the CPU
  // every line (the points of one shape that differ only in the axes) is therefore timed in
  // `passes` passes, forward, backward, forward..., each taking the point's samples within 1 / passes of its time cap (so a call
  // under ~4 ms gets all its samples in every pass, a slower one the same time in all), and a
  // point keeps its fastest pass: every point of a line gets the same spread of periods, and
  // the disturbance the VM adds (it only ever slows a call) is left out the same way for all. It
  // replaces timing a CPU point under 2 ms three times back to back (a descheduled OpenMP thread
  // stalls a parallel region for a scheduler tick), now for every point and spread over the line.
  const int passes = opt.passes > 0 ? opt.passes : opt.device == DeviceKind::cpu ? 3 : 1;
  harness::Options pass_ho = ho;
  pass_ho.perf_max_seconds = ho.perf_max_seconds / passes;
  auto line_key = [](const Job& j) {
    std::string k = j.grid->op + "," + j.impl;
    for (const std::string& n : j.grid->dims)
      if (std::find(j.grid->axes.begin(), j.grid->axes.end(), n) == j.grid->axes.end())
        k += "," + std::to_string(j.dims.at(n));
    return k;
  };
  double measured_seconds = 0;
  int timed = 0;
  for (size_t first = 0; first < jobs.size();) {
    size_t last = first + 1;  // jobs are sorted by shape, then axes: a line is a run of equal keys
    while (last < jobs.size() && line_key(jobs[last]) == line_key(jobs[first])) ++last;
    struct Point {
      Cost cost;
      Case c;
      double best_us = -1;
      double energy_uj = -1;
      std::vector<plan::Decision> decisions;  // Note [plan regimes] in opforge/plan.h
      std::string failed;
    };
    std::vector<Point> pts(last - first);
    for (size_t j = first; j < last; ++j) {
      Point& p = pts[j - first];
      try {
        p.cost = cost_at(jobs[j].grid->op, opt.dtype, jobs[j].dims);
        p.c = case_at(jobs[j].grid->op, jobs[j].dims);
      } catch (const std::exception& e) {
        p.failed = e.what();
      }
    }
    for (int pass = 0; pass < passes; ++pass) {
      for (size_t i = 0; i < pts.size(); ++i) {
        const size_t at = pass % 2 ? pts.size() - 1 - i : i;
        const Job& job = jobs[first + at];
        Point& p = pts[at];
        if (!p.failed.empty()) continue;
        if (opt.progress) {
          const double done_calls = double(timed), all_calls = double(jobs.size()) * passes;
          const double eta = timed ? measured_seconds / done_calls * (all_calls - done_calls) : -1;
          std::cerr << "\r\033[K[" << first + at << "/" << jobs.size() << "] " << job.grid->op << " " << job.impl
                    << " " << dims_line(*job.grid, job.dims)
                    << (passes > 1 ? "  pass " + std::to_string(pass + 1) + "/" + std::to_string(passes) : "")
                    << "  ETA " << clock_text(eta) << std::flush;
        }
        const auto t0 = Clock::now();
        try {
          harness::PerfExtras extras;
          extras.cost = &p.cost;
          extras.energy_mj = energy;
          // 0.12 s of calls between two readings of the cumulative counter (updated every few ms on
          // Hopper): within a few percent, and the energy run no longer dominates a collection.
          extras.energy_seconds = 0.12;
          harness::Result r;
          {
            plan::Recording recording;
            r = harness::perf_case(reg, pass_ho, job.grid->op, job.impl, p.c, dtype, sum.ceiling_gbps, extras);
            if (pass == 0) p.decisions = recording.decisions();
          }
          if (r.status != harness::Status::pass) {
            p.failed = r.detail;
          } else if (p.best_us < 0 || r.median_us < p.best_us) {
            p.best_us = r.median_us;
            p.energy_uj = r.energy_uj;
          }
        } catch (const std::exception& e) {
          p.failed = e.what();
        }
        measured_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        ++timed;
      }
    }
    for (size_t j = first; j < last; ++j) {  // the line's rows, in grid order
      const Job& job = jobs[j];
      const Point& p = pts[j - first];
      if (!p.failed.empty() || p.best_us < 0) {
        notice(job.grid->op + " " + job.impl + " " + dims_line(*job.grid, job.dims) + ": " + p.failed);
        ++sum.not_applicable;
        continue;
      }
      Row row;
      row.impl = job.impl;
      row.dtype = dtype_text;
      row.dims = job.dims;
      row.median_us = p.best_us;
      row.bytes = p.cost.bytes;
      row.flops = p.cost.flops;
      if (p.energy_uj >= 0) row.energy_uj = p.energy_uj;
      row.plan = p.decisions;
      append_rows(job.path, job.grid->dims, {row});
      ++sum.measured;
    }
    first = last;
  }
  if (opt.progress) std::cerr << "\r\033[K" << std::flush;
  if (sum.measured > 0 && sum.ceiling_gflops > 0 && opt.gemm_gflops <= 0) {  // Note [ceiling drift]
    try {
      sum.ceiling_gflops_end = gemm_ceiling(reg, opt, sum.ceiling_gbps);
    } catch (const std::exception&) {
      sum.ceiling_gflops_end = 0;
    }
    const double drift = sum.ceiling_gflops_end / sum.ceiling_gflops - 1;
    if (sum.ceiling_gflops_end > 0 && std::abs(drift) > 0.10)
      notice("the GEMM ceiling moved by " + std::to_string(int(std::lround(drift * 100))) + "% during the collection (" +
             std::to_string(int(sum.ceiling_gflops)) + " -> " + std::to_string(int(sum.ceiling_gflops_end)) +
             " GFLOP/s): the machine changed speed; collect again in a quiet period");
  }
  sum.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return sum;
}

}  // namespace opforge::perfdb
