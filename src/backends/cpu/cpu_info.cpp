#include "backends/cpu/cpu_info.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace opforge::cpu {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

}  // namespace

int64_t parse_size(const std::string& text) {
  if (text.empty()) return 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || value <= 0) return 0;
  switch (*end) {
    case 'K': case 'k': return int64_t(value) << 10;
    case 'M': case 'm': return int64_t(value) << 20;
    case 'G': case 'g': return int64_t(value) << 30;
    default: return int64_t(value);
  }
}

namespace {

// Source 1 of Note [cache sizes]: the data or unified cache of `level` in cpu0's sysfs entries.
int64_t sysfs_cache_bytes(int level) {
  for (int index = 0; index < 16; ++index) {
    std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::string lvl = read_line(dir + "level");
    if (lvl.empty()) break;
    std::string type = read_line(dir + "type");
    if (std::atoi(lvl.c_str()) != level || type == "Instruction") continue;
    return parse_size(read_line(dir + "size"));
  }
  return 0;
}

// Source 2: glibc's sysconf (0 or -1 when it does not know).
int64_t sysconf_cache_bytes(int level) {
  long v = -1;
#if defined(_SC_LEVEL1_DCACHE_SIZE)
  if (level == 1) v = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  if (level == 2) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (level == 3) v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  return v > 0 ? int64_t(v) : 0;
}

CacheInfo find_cache(int level, const char* env_name, int64_t fallback) {
  if (const char* env = std::getenv(env_name)) {
    if (int64_t v = parse_size(env); v > 0) return {v, env_name};
  }
  if (int64_t v = sysfs_cache_bytes(level); v > 0) return {v, "sysfs"};
  if (int64_t v = sysconf_cache_bytes(level); v > 0) return {v, "sysconf"};
  return {fallback, "fallback"};
}

CpuInfo read_cpu_info() {
  CpuInfo info;
  info.l1d = find_cache(1, "OPFORGE_CPU_L1D", kFallbackL1dBytes);
  info.l2 = find_cache(2, "OPFORGE_CPU_L2", kFallbackL2Bytes);
  info.l3 = find_cache(3, "OPFORGE_CPU_L3", kFallbackL3Bytes);
  if (int64_t line = parse_size(read_line(
          "/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size"));
      line > 0)
    info.line_bytes = line;
#ifdef _OPENMP
  info.threads = omp_get_max_threads();
#else
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  info.threads = online > 0 ? int(online) : 1;
#endif
  return info;
}

std::string bytes_str(int64_t b) {
  if (b >= (int64_t(1) << 20) && b % (int64_t(1) << 20) == 0)
    return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

}  // namespace

const CacheInfo& CpuInfo::cache(CacheLevel level) const {
  switch (level) {
    case CacheLevel::l1d: return l1d;
    case CacheLevel::l2: return l2;
    case CacheLevel::l3: return l3;
  }
  return l2;
}

std::string CpuInfo::str() const {
  return "L1d " + bytes_str(l1d.bytes) + " (" + l1d.source + "), L2 " + bytes_str(l2.bytes) +
         " (" + l2.source + "), L3 " + bytes_str(l3.bytes) + " (" + l3.source + "), " +
         std::to_string(threads) + " threads";
}

namespace {
CpuInfo& mutable_info() {
  static CpuInfo info = read_cpu_info();
  return info;
}
}  // namespace

const CpuInfo& cpu_info() { return mutable_info(); }

int64_t set_l3_bytes_for_testing(int64_t bytes) {
  CpuInfo& info = mutable_info();
  const int64_t previous = info.l3.bytes;
  info.l3.bytes = bytes;
  return previous;
}

int set_thread_count_for_testing(int threads) {
#ifdef _OPENMP
  const int previous = omp_get_max_threads();
  omp_set_num_threads(threads);
  return previous;
#else
  return 1;
#endif
}

}  // namespace opforge::cpu
