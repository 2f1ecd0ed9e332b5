// TEMPORARY stand-in for the perf database (exact-match queries only), so that the estimator
// links and its tests run before the real implementation is merged. Delete on merge.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "opforge/perfdb.h"

namespace opforge::perfdb {

namespace fs = std::filesystem;

const char* method_name(Method m) {
  switch (m) {
    case Method::measured: return "measured";
    case Method::interpolated: return "interpolated";
    case Method::extrapolated: return "extrapolated";
    case Method::modelled: return "modelled";
  }
  return "?";
}

static std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::stringstream ss(s);
  while (std::getline(ss, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

OpTable read_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::io, "cannot read " + path);
  OpTable t;
  t.path = path;
  std::string line;
  std::vector<std::string> cols;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    if (line[0] == '#') {
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(2, colon - 2), value = line.substr(colon + 1);
      while (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (key == "system") t.header.system = value;
      if (key == "op") t.header.op = value;
      if (key == "ceiling_gbps") t.header.ceiling_gbps = std::stod(value);
      if (key == "ceiling_gflops") t.header.ceiling_gflops = std::stod(value);
      if (key == "axes") t.header.axes = split(value, ',');
      continue;
    }
    if (cols.empty()) {
      cols = split(line, ',');
      for (size_t i = 2; i + 4 < cols.size(); ++i) t.dim_names.push_back(cols[i]);
      continue;
    }
    std::vector<std::string> f = split(line, ',');
    if (f.size() != cols.size()) throw Error(ErrorCode::parse, path + ":" + std::to_string(n) + ": wrong field count");
    Row r;
    r.impl = f[0];
    r.dtype = f[1];
    for (size_t i = 0; i < t.dim_names.size(); ++i) r.dims[t.dim_names[i]] = std::stoll(f[2 + i]);
    size_t k = 2 + t.dim_names.size();
    r.median_us = std::stod(f[k]);
    r.bytes = std::stod(f[k + 1]);
    r.flops = std::stod(f[k + 2]);
    if (!f[k + 3].empty()) r.energy_uj = std::stod(f[k + 3]);
    t.rows.push_back(r);
  }
  return t;
}

static fs::path base_of(const std::string& root) {
  std::string r = root;
  if (r.empty()) {
    const char* env = std::getenv("OPFORGE_PERF_DATA");
    r = env && *env ? env : "data/perf";
  }
  if (fs::is_directory(fs::path(r) / "data" / "perf")) return fs::path(r) / "data" / "perf";
  return r;
}

std::vector<std::string> Database::systems(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base_of(root), ec))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  return out;
}

Database Database::load(const std::string& system, const std::string& root) {
  fs::path dir = base_of(root) / system;
  if (!fs::is_directory(dir)) throw PerfDataNotAvailable("no perf data for system '" + system + "' in " + dir.string());
  Database db;
  db.system_ = system;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".csv") db.tables_[e.path().stem().string()] = read_table(e.path().string());
  return db;
}

const OpTable& Database::table(const std::string& op) const {
  auto it = tables_.find(op);
  if (it == tables_.end()) throw PerfDataNotAvailable("system '" + system_ + "': no data for op '" + op + "'");
  return it->second;
}

std::vector<std::string> Database::ops() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tables_) out.push_back(k);
  return out;
}

Answer Database::query(const std::string& op, const std::string& impl, const std::string& dtype,
                       const Dims& dims) const {
  const OpTable& t = table(op);
  const Row* best = nullptr;
  for (const Row& r : t.rows)
    if ((impl == "auto" || r.impl == impl) && r.dtype == dtype && r.dims == dims)
      if (!best || r.median_us < best->median_us) best = &r;
  if (!best) throw PerfDataNotAvailable("system '" + system_ + "', op '" + op + "': no stored point at these dims");
  Answer a;
  a.us = best->median_us;
  a.energy_uj = best->energy_uj;
  a.impl = best->impl;
  a.method = Method::measured;
  a.how = "measured (stub)";
  return a;
}

}  // namespace opforge::perfdb
