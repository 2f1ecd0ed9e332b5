// Reading, writing and validating one performance table (data/perf/<system>/<op>.csv); the format
// is specified in include/opforge/perfdb.h.
//
// Validation is strict: a file either loads completely or the load fails with an Error whose
// message starts "<path>:<line>: " (1-based), so a damaged file is found and fixed, never half-used.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "opforge/dtype.h"
#include "opforge/perfdb.h"
#include "opforge/plan.h"
#include "core/parse_number.h"
#include "perfdb/internal.h"

namespace opforge::perfdb {

namespace fs = std::filesystem;

namespace {

const char* const kRequiredKeys[] = {"system", "op", "device", "commit", "date",
                                     "ceiling_gbps", "ceiling_gflops", "axes"};
const char* const kLeadColumns[] = {"impl", "dtype"};
const char* const kTailColumns[] = {"median_us", "bytes", "flops", "energy_uj"};

[[noreturn]] void fail(ErrorCode code, const std::string& path, int line, const std::string& what) {
  throw Error(code, fmt::format("{}:{}: {}", path, line, what));
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

bool is_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

// A whole-field integer (no sign, no spaces, no trailing characters).
bool parse_int(const std::string& s, int64_t& v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_double(const std::string& s, double& v) { return opforge::detail::parse_finite_double(s, v); }

std::string number(double v) { return fmt::format("{}", v); }

std::string row_key(const Row& r, const std::vector<std::string>& dim_names) {
  std::string k = r.impl + "," + r.dtype;
  for (const std::string& d : dim_names) k += "," + std::to_string(r.dims.at(d));
  return k;
}

std::string row_line(const Row& r, const std::vector<std::string>& dim_names, bool with_plan) {
  std::string line = r.impl + "," + r.dtype;
  for (const std::string& d : dim_names) line += "," + std::to_string(r.dims.at(d));
  line += "," + number(r.median_us) + "," + number(r.bytes) + "," + number(r.flops) + ",";
  if (r.energy_uj) line += number(*r.energy_uj);
  if (with_plan) line += "," + plan::to_text(r.plan);
  return line + "\n";
}

bool any_plan(const std::vector<Row>& rows) {
  return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.plan.empty(); });
}

// What write_table / append_rows accept is exactly what read_table accepts.
void check_row_for_writing(const Row& r, const std::vector<std::string>& dim_names, const std::string& path) {
  auto bad = [&](const std::string& what) {
    throw Error(ErrorCode::invalid_argument, fmt::format("{}: cannot write row {}: {}", path, r.impl, what));
  };
  if (!is_name(r.impl)) bad(fmt::format("impl '{}' is not a name", r.impl));
  try {
    if (dtype_name(parse_dtype(r.dtype)) != r.dtype) bad(fmt::format("dtype '{}' is not a canonical name", r.dtype));
  } catch (const Error&) {
    bad(fmt::format("unknown dtype '{}'", r.dtype));
  }
  if (r.dims.size() != dim_names.size()) bad(fmt::format("has {} dims, the table {}", r.dims.size(), dim_names.size()));
  for (const std::string& d : dim_names) {
    auto it = r.dims.find(d);
    if (it == r.dims.end()) bad(fmt::format("dim '{}' missing", d));
    if (it->second <= 0) bad(fmt::format("dim {}={} is not > 0", d, it->second));
  }
  if (!(std::isfinite(r.median_us) && r.median_us > 0)) bad(fmt::format("median_us {} is not finite > 0", r.median_us));
  if (!(std::isfinite(r.bytes) && r.bytes >= 0)) bad(fmt::format("bytes {} is not finite >= 0", r.bytes));
  if (!(std::isfinite(r.flops) && r.flops >= 0)) bad(fmt::format("flops {} is not finite >= 0", r.flops));
  if (r.energy_uj && !(std::isfinite(*r.energy_uj) && *r.energy_uj >= 0))
    bad(fmt::format("energy_uj {} is not finite >= 0", *r.energy_uj));
  try {
    if (plan::parse(plan::to_text(r.plan)) != r.plan) bad("its plan does not survive writing and reading back");
  } catch (const Error& e) {
    bad(e.what());
  }
}

std::string header_text(const OpTable& t, bool with_plan) {
  const FileHeader& h = t.header;
  std::string s = fmt::format("# opforge-perfdb {}\n", kFormatVersion);
  s += fmt::format("# system: {}\n# op: {}\n# device: {}\n# commit: {}\n# date: {}\n", h.system, h.op,
                   h.device, h.commit, h.date);
  s += fmt::format("# ceiling_gbps: {}\n# ceiling_gflops: {}\n", number(h.ceiling_gbps), number(h.ceiling_gflops));
  s += "# axes: ";
  for (size_t i = 0; i < h.axes.size(); ++i) s += (i ? "," : "") + h.axes[i];
  s += "\n";
  for (const auto& [k, v] : h.extra) s += fmt::format("# {}: {}\n", k, v);
  s += "impl,dtype";
  for (const std::string& d : t.dim_names) s += "," + d;
  return s + ",median_us,bytes,flops,energy_uj" + (with_plan ? ",plan\n" : "\n");
}

void check_table_for_writing(const OpTable& t, const std::string& path) {
  auto bad = [&](const std::string& what) {
    throw Error(ErrorCode::invalid_argument, fmt::format("{}: cannot write table: {}", path, what));
  };
  const FileHeader& h = t.header;
  for (const std::string* v : {&h.system, &h.op, &h.device, &h.commit, &h.date})
    if (v->empty() || v->find('\n') != std::string::npos) bad("system, op, device, commit and date must be one non-empty line each");
  if (!is_name(h.system) || !is_name(h.op)) bad("system and op must be names");
  if (!(std::isfinite(h.ceiling_gbps) && h.ceiling_gbps > 0)) bad("ceiling_gbps must be finite > 0");
  if (!(std::isfinite(h.ceiling_gflops) && h.ceiling_gflops >= 0)) bad("ceiling_gflops must be finite >= 0");
  if (t.dim_names.empty()) bad("no dims");
  std::set<std::string> names;
  for (const std::string& d : t.dim_names) {
    if (!is_name(d) || !names.insert(d).second) bad(fmt::format("dim name '{}' is empty, not a name or repeated", d));
    for (const char* c : kLeadColumns) if (d == c) bad(fmt::format("dim name '{}' is a fixed column", d));
    for (const char* c : kTailColumns) if (d == c) bad(fmt::format("dim name '{}' is a fixed column", d));
  }
  if (h.axes.empty() || h.axes.size() > 2) bad("axes must name 1 or 2 dims");
  for (const std::string& a : h.axes)
    if (!names.count(a)) bad(fmt::format("axis '{}' is not a dim", a));
  if (h.axes.size() == 2 && h.axes[0] == h.axes[1]) bad("the two axes are the same dim");
  for (const auto& [k, v] : h.extra) {
    if (!is_name(k) || v.empty() || v.find('\n') != std::string::npos)
      bad(fmt::format("extra header '{}' needs a name and a one-line value", k));
    for (const char* r : kRequiredKeys) if (k == r) bad(fmt::format("extra header key '{}' is a standard key", k));
  }
}

}  // namespace

void write_table(const OpTable& table, const std::string& path) {
  check_table_for_writing(table, path);
  std::set<std::string> keys;
  const bool with_plan = table.has_plan || any_plan(table.rows);
  std::string text = header_text(table, with_plan);
  for (const Row& r : table.rows) {
    check_row_for_writing(r, table.dim_names, path);
    if (!keys.insert(row_key(r, table.dim_names)).second)
      throw Error(ErrorCode::invalid_argument, fmt::format("{}: cannot write table: duplicate row {}", path, row_key(r, table.dim_names)));
    text += row_line(r, table.dim_names, with_plan);
  }
  // Written next to the target and renamed over it, so that a reader never sees half a file.
  std::error_code ec;
  fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(ErrorCode::io, fmt::format("{}: cannot write", tmp));
    f << text;
    f.flush();
    if (!f) throw Error(ErrorCode::io, fmt::format("{}: write failed", tmp));
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(ErrorCode::io, fmt::format("{}: cannot replace: {}", path, ec.message()));
  }
}

void append_rows(const std::string& path, const std::vector<std::string>& dim_names, const std::vector<Row>& rows) {
  OpTable existing = read_table(path);  // validates what is there
  if (existing.dim_names != dim_names) {
    std::string want, have;
    for (const std::string& d : dim_names) want += (want.empty() ? "" : ",") + d;
    for (const std::string& d : existing.dim_names) have += (have.empty() ? "" : ",") + d;
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{}: cannot append rows with dims {}: the file has dims {}", path, want, have));
  }
  std::set<std::string> keys;
  for (const Row& r : existing.rows) keys.insert(row_key(r, dim_names));
  std::string text;
  for (const Row& r : rows) {
    check_row_for_writing(r, dim_names, path);
    if (!keys.insert(row_key(r, dim_names)).second)
      throw Error(ErrorCode::invalid_argument, fmt::format("{}: cannot append row {}: already stored", path, row_key(r, dim_names)));
    text += row_line(r, dim_names, existing.has_plan);
  }
  if (!existing.has_plan && any_plan(rows)) {  // a file from before the plan column: rewritten with it
    existing.rows.insert(existing.rows.end(), rows.begin(), rows.end());
    existing.has_plan = true;
    write_table(existing, path);
    return;
  }
  std::ofstream f(path, std::ios::binary | std::ios::app);
  if (!f) throw Error(ErrorCode::io, fmt::format("{}: cannot open for appending", path));
  f << text;  // whole lines in one write; read_table rejects a torn last line
  f.flush();
  if (!f) throw Error(ErrorCode::io, fmt::format("{}: append failed", path));
}

OpTable read_table(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::io, fmt::format("{}: cannot open", path));
  std::stringstream buffer;
  buffer << f.rdbuf();
  if (f.bad()) throw Error(ErrorCode::io, fmt::format("{}: read failed", path));
  return parse_table(buffer.str(), path);
}

OpTable parse_table(const std::string& content, const std::string& path) {
  OpTable t;
  t.path = path;
  std::map<std::string, int> seen_keys;  // key -> line
  std::map<std::string, int> seen_rows;  // row key -> line
  bool have_columns = false;
  int line_no = 0;
  size_t ncols = 0;
  std::istringstream lines(content);
  std::string raw;
  auto parse_error = [&](const std::string& what) { fail(ErrorCode::parse, path, line_no, what); };

  while (std::getline(lines, raw)) {
    ++line_no;
    if (lines.eof() && !content.empty() && content.back() != '\n')
      parse_error("the last line has no line end (an interrupted write?)");
    std::string line = trim(raw);
    if (line_no == 1) {
      const std::string magic = "# opforge-perfdb ";
      int64_t version = 0;
      if (line.rfind(magic, 0) != 0 || !parse_int(trim(line.substr(magic.size())), version))
        parse_error(fmt::format("expected '# opforge-perfdb {}' as the first line, got '{}'", kFormatVersion, line));
      if (version != kFormatVersion)
        parse_error(fmt::format("format version {} is not supported (this opforge reads version {})", version, kFormatVersion));
      t.header.version = int(version);
      continue;
    }
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (have_columns) parse_error("a header line after the column header");
      size_t colon = line.find(':');
      if (colon == std::string::npos) parse_error(fmt::format("expected '# key: value', got '{}'", line));
      std::string key = trim(line.substr(1, colon - 1)), value = trim(line.substr(colon + 1));
      if (!is_name(key)) parse_error(fmt::format("bad header key '{}'", key));
      if (auto it = seen_keys.find(key); it != seen_keys.end())
        parse_error(fmt::format("header key '{}' repeated (first on line {})", key, it->second));
      seen_keys[key] = line_no;
      FileHeader& h = t.header;
      if ((key == "system" || key == "op") && !is_name(value))
        parse_error(fmt::format("{} must be a name (letters, digits, _ - .), got '{}'", key, value));
      if (key == "system") h.system = value;
      else if (key == "op") h.op = value;
      else if (key == "device") h.device = value;
      else if (key == "commit") h.commit = value;
      else if (key == "date") h.date = value;
      else if (key == "ceiling_gbps") {
        if (!parse_double(value, h.ceiling_gbps) || h.ceiling_gbps <= 0)
          parse_error(fmt::format("ceiling_gbps must be a finite number > 0, got '{}'", value));
      } else if (key == "ceiling_gflops") {
        if (!parse_double(value, h.ceiling_gflops) || h.ceiling_gflops < 0)
          parse_error(fmt::format("ceiling_gflops must be a finite number >= 0, got '{}'", value));
      } else if (key == "axes") {
        std::string v = value;
        std::replace(v.begin(), v.end(), ',', ' ');
        std::istringstream words(v);
        for (std::string a; words >> a;) h.axes.push_back(a);
        if (h.axes.empty() || h.axes.size() > 2) parse_error(fmt::format("axes must name 1 or 2 dims, got '{}'", value));
        if (h.axes.size() == 2 && h.axes[0] == h.axes[1]) parse_error(fmt::format("axis '{}' named twice", h.axes[0]));
      } else {
        h.extra[key] = value;
      }
      if (value.empty()) parse_error(fmt::format("header key '{}' has no value", key));
      continue;
    }
    std::vector<std::string> fields = split(line, ',');
    if (!have_columns) {
      for (const char* k : kRequiredKeys)
        if (!seen_keys.count(k)) parse_error(fmt::format("header key '{}' missing before the column header", k));
      const size_t lead = std::size(kLeadColumns);
      t.has_plan = !fields.empty() && fields.back() == "plan";  // the optional last column
      if (t.has_plan) fields.pop_back();
      const size_t tail = std::size(kTailColumns);
      bool ok = fields.size() > lead + tail;
      for (size_t i = 0; ok && i < lead; ++i) ok = fields[i] == kLeadColumns[i];
      for (size_t i = 0; ok && i < tail; ++i) ok = fields[fields.size() - tail + i] == kTailColumns[i];
      if (!ok) parse_error(fmt::format("expected the column header 'impl,dtype,<dims...>,median_us,bytes,flops,energy_uj[,plan]', got '{}'", line));
      for (size_t i = lead; i < fields.size() - tail; ++i) {
        const std::string& d = fields[i];
        if (!is_name(d)) parse_error(fmt::format("bad dim name '{}' in the column header", d));
        if (std::find(t.dim_names.begin(), t.dim_names.end(), d) != t.dim_names.end())
          parse_error(fmt::format("dim '{}' appears twice in the column header", d));
        for (const char* c : kLeadColumns) if (d == c) parse_error(fmt::format("column '{}' appears twice", d));
        for (const char* c : kTailColumns) if (d == c) parse_error(fmt::format("column '{}' appears twice", d));
        t.dim_names.push_back(d);
      }
      for (const std::string& a : t.header.axes)
        if (std::find(t.dim_names.begin(), t.dim_names.end(), a) == t.dim_names.end())
          fail(ErrorCode::parse, path, seen_keys["axes"], fmt::format("axis '{}' is not one of the columns", a));
      ncols = fields.size() + (t.has_plan ? 1 : 0);
      have_columns = true;
      continue;
    }
    if (fields.size() != ncols)
      parse_error(fmt::format("expected {} fields, got {}", ncols, fields.size()));
    Row r;
    r.impl = trim(fields[0]);
    if (!is_name(r.impl)) parse_error(fmt::format("bad impl name '{}'", fields[0]));
    try {
      r.dtype = dtype_name(parse_dtype(trim(fields[1])));
    } catch (const Error& e) {
      parse_error(e.what());
    }
    size_t col = 2;
    for (const std::string& d : t.dim_names) {
      std::string v = trim(fields[col++]);
      int64_t x = 0;
      if (!parse_int(v, x) || x <= 0) parse_error(fmt::format("dim {} must be an integer > 0, got '{}'", d, v));
      r.dims[d] = x;
    }
    auto number_field = [&](const char* name, double& out, bool positive) {
      std::string v = trim(fields[col++]);
      if (!parse_double(v, out) || (positive ? out <= 0 : out < 0))
        parse_error(fmt::format("{} must be a finite number {} 0, got '{}'", name, positive ? ">" : ">=", v));
    };
    number_field("median_us", r.median_us, true);
    number_field("bytes", r.bytes, false);
    number_field("flops", r.flops, false);
    if (std::string v = trim(fields[col]); !v.empty()) {
      double e = 0;
      if (!parse_double(v, e) || e < 0) parse_error(fmt::format("energy_uj must be empty or a finite number >= 0, got '{}'", v));
      r.energy_uj = e;
    }
    if (t.has_plan) {
      try {
        r.plan = plan::parse(trim(fields[col + 1]));
      } catch (const Error& e) {
        parse_error(e.what());
      }
    }
    std::string key = row_key(r, t.dim_names);
    if (auto it = seen_rows.find(key); it != seen_rows.end())
      parse_error(fmt::format("duplicate row {} (first on line {})", key, it->second));
    seen_rows[key] = line_no;
    t.rows.push_back(std::move(r));
  }
  if (line_no == 0) fail(ErrorCode::parse, path, 1, fmt::format("empty file (expected '# opforge-perfdb {}')", kFormatVersion));
  if (!have_columns) {
    for (const char* k : kRequiredKeys)
      if (!seen_keys.count(k)) fail(ErrorCode::parse, path, line_no + 1, fmt::format("header key '{}' missing", k));
    fail(ErrorCode::parse, path, line_no + 1, "the column header is missing");
  }
  return t;
}

}  // namespace opforge::perfdb
