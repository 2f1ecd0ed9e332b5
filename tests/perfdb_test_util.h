// Helpers shared by the perf database tests: a scratch folder that removes itself, and a
// one-axis rms_norm table built from a time function (and optionally a plan function).
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

#include "opforge/perfdb.h"
#include "opforge/plan.h"

namespace opforge::test_util {

// A fresh, empty folder under the system's temp directory, removed with everything in it when
// the object goes.
class ScratchFolder {
 public:
  explicit ScratchFolder(const std::string& tag) {
    static std::atomic<int> counter{0};
    namespace fs = std::filesystem;
    path_ = fs::temp_directory_path() /
            ("opforge_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// rms_norm rows of `system` along `tokens` at hidden 4096, cpu / bf16: time = time_of(tokens),
// bytes 4 * tokens * hidden, and, when plan_of is given, plan = plan_of(tokens).
inline perfdb::OpTable rms_norm_line(
    const std::string& system, const std::vector<int64_t>& tokens,
    const std::function<double(double)>& time_of,
    const std::function<std::vector<plan::Decision>(double)>& plan_of = nullptr) {
  perfdb::OpTable t;
  t.header.system = system;
  t.header.op = "rms_norm";
  t.header.device = "test device";
  t.header.commit = "abc1234";
  t.header.date = "2026-11-27";
  t.header.ceiling_gbps = 20;
  t.header.axes = {"tokens"};
  t.dim_names = {"tokens", "hidden"};
  for (int64_t tok : tokens) {
    perfdb::Row r;
    r.impl = "cpu";
    r.dtype = "bf16";
    r.dims = {{"tokens", tok}, {"hidden", 4096}};
    r.median_us = time_of(double(tok));
    r.bytes = 4.0 * double(tok) * 4096;
    if (plan_of) r.plan = plan_of(double(tok));
    t.rows.push_back(r);
  }
  return t;
}

}  // namespace opforge::test_util
