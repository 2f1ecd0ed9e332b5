// Fuzz target: opforge::perfdb::parse_table (the performance database's file reader). Anything it
// accepts must write back (write_table) and read again to the same header and rows.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "opforge/error.h"
#include "opforge/perfdb.h"

namespace {
bool same(const opforge::perfdb::OpTable& a, const opforge::perfdb::OpTable& b) {
  const auto &ha = a.header, &hb = b.header;
  if (ha.system != hb.system || ha.op != hb.op || ha.device != hb.device || ha.commit != hb.commit ||
      ha.date != hb.date || ha.ceiling_gbps != hb.ceiling_gbps || ha.ceiling_gflops != hb.ceiling_gflops ||
      ha.axes != hb.axes || ha.extra != hb.extra || a.dim_names != b.dim_names || a.rows.size() != b.rows.size())
    return false;
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const auto &x = a.rows[i], &y = b.rows[i];
    if (x.impl != y.impl || x.dtype != y.dtype || x.dims != y.dims || x.median_us != y.median_us ||
        x.bytes != y.bytes || x.flops != y.flops || x.energy_uj != y.energy_uj)
      return false;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  opforge::perfdb::OpTable t;
  try {
    t = opforge::perfdb::parse_table(std::string(reinterpret_cast<const char*>(data), size), "fuzz.csv");
  } catch (const opforge::Error&) {
    return 0;
  }
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("opforge_perfdb_fuzz_" + std::to_string(::getpid()) + ".csv")).string();
  opforge::perfdb::write_table(t, path);
  const opforge::perfdb::OpTable again = opforge::perfdb::read_table(path);
  if (!same(t, again)) {
    std::fprintf(stderr, "round trip differs (%s)\n", path.c_str());
    __builtin_trap();
  }
  return 0;
}
