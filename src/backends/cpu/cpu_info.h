// What the CPU backend knows about the host: cache sizes and thread count.
//
// Note [cache sizes]: sizes are read once per process, in this order of trust:
//   1. /sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}: the kernel's view, which is
//      what a VM or container was given (a KVM guest may report its host's L3 through cpuid);
//   2. sysconf(_SC_LEVEL1_DCACHE_SIZE / _SC_LEVEL2_CACHE_SIZE / _SC_LEVEL3_CACHE_SIZE) (glibc,
//      from cpuid);
//   3. fallbacks of 32 KiB (L1d), 1 MiB (L2) and 8 MiB (L3): common x86-64 and Arm server values.
// Each level keeps the name of the source it came from, for reports (`opforge support`, perf).
// OPFORGE_CPU_L1D / OPFORGE_CPU_L2 / OPFORGE_CPU_L3 (bytes) override a level, to test how block
// sizes react to another machine's caches.
#pragma once

#include <cstdint>
#include <string>

namespace opforge::cpu {

enum class CacheLevel : uint8_t { l1d, l2, l3 };

struct CacheInfo {
  int64_t bytes = 0;
  std::string source;  // "sysfs", "sysconf", "fallback", "OPFORGE_CPU_L2"
};

struct CpuInfo {
  CacheInfo l1d, l2, l3;
  int64_t line_bytes = 64;
  int threads = 1;  // OpenMP's maximum team size (OMP_NUM_THREADS or the online cores)

  const CacheInfo& cache(CacheLevel level) const;
  std::string str() const;  // "L1d 32 KiB (sysfs), L2 512 KiB (sysfs), L3 8 MiB (sysfs), 2 threads"
};

// Read once (thread-safe) and cached for the life of the process.
const CpuInfo& cpu_info();

// Set OpenMP's team size for later parallel regions of the calling thread; returns the previous
// size. For tests (results that must not depend on the thread count); cpu_info().threads keeps
// the value read at start-up.
int set_thread_count_for_testing(int threads);
// For tests that must cross an L3-sized threshold (streaming stores, FLCE chunks) with small
// tensors, on machines that report a large L3 (a VM may report its host's): sets the L3 size
// cpu_info() reports and returns the previous one. Call from a test's own process only, outside
// any kernel, and restore it.
int64_t set_l3_bytes_for_testing(int64_t bytes);

// "32K", "8192K", "1M", "524288" -> bytes (sysfs sizes, the OPFORGE_CPU_* overrides); 0 when
// unreadable.
int64_t parse_size(const std::string& text);

// The fallback sizes of Note [cache sizes].
inline constexpr int64_t kFallbackL1dBytes = int64_t(32) << 10;
inline constexpr int64_t kFallbackL2Bytes = int64_t(1) << 20;
inline constexpr int64_t kFallbackL3Bytes = int64_t(8) << 20;

}  // namespace opforge::cpu
