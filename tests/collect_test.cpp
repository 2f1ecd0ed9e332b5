// The collector: grid cases run, cost_at matches the op's cost model on real tensors, the grids
// are sorted and capped, bad names are errors, and a collection resumes without repeating rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "backends/cpu/cpu_info.h"
#include "harness/instance.h"
#include "opforge/collect.h"
#include "opforge/perfdb.h"
#include "opforge/registry.h"

namespace {

using namespace opforge;
using perfdb::Dims;

// A small point of every known op.
Dims tiny(const std::string& op) {
  if (op == "silu_and_mul" || op == "gelu_and_mul") return {{"tokens", 3}, {"d", 8}};
  if (op == "rotary_embedding") return {{"tokens", 3}, {"q_heads", 4}, {"kv_heads", 2}, {"head_size", 8}};
  if (op == "linear") return {{"tokens", 3}, {"n", 5}, {"k", 8}};
  if (op == "attention_prefill")
    return {{"batch", 2}, {"tokens", 3}, {"q_heads", 4}, {"kv_heads", 2}, {"head_dim", 8}};
  if (op == "attention_decode")
    return {{"batch", 2}, {"context", 5}, {"q_heads", 4}, {"kv_heads", 2}, {"head_dim", 8}};
  if (op == "topk_softmax") return {{"tokens", 3}, {"experts", 8}, {"k", 2}};
  if (op == "embedding") return {{"tokens", 3}, {"vocab", 10}, {"hidden", 8}};
  if (op == "moe_permute" || op == "moe_unpermute") return {{"tokens", 3}, {"hidden", 8}, {"experts", 4}, {"k", 2}};
  return {{"tokens", 3}, {"hidden", 8}};
}

harness::Options fast_options() {
  harness::Options o;
  o.perf_min_samples = 1;
  o.perf_max_samples = 2;
  o.perf_min_seconds = 0;
  return o;
}

TEST(Collect, EveryKnownOpHasACaseThatRuns) {
  const Registry& reg = global_registry();
  ASSERT_EQ(perfdb::known_ops().size(), 15u);
  int ran = 0;
  for (const perfdb::OpGrid& g : perfdb::known_ops()) {
    SCOPED_TRACE(g.op);
    const OpEntry& op = reg.op(g.op);
    const Case c = perfdb::case_at(g.op, tiny(g.op));
    for (const KernelEntry& k : op.kernels) {
      if (k.desc.device != DeviceKind::cpu || !k.availability().ok) continue;
      harness::Result r = harness::perf_case(reg, fast_options(), g.op, k.impl(), c, DType::f32, 10.0);
      EXPECT_EQ(r.status, harness::Status::pass) << k.impl() << ": " << r.detail;
      EXPECT_GT(r.median_us, 0) << k.impl();
      ++ran;
    }
  }
  EXPECT_GE(ran, 26);  // reference + cpu of every op
}

// cost_at (views at a dummy address) equals the op's cost model on the materialized tensors.
TEST(Collect, CostAtEqualsTheCostOfTheMaterializedCase) {
  using namespace harness::detail;
  const Registry& reg = global_registry();
  int compared = 0;
  for (const perfdb::OpGrid& g : perfdb::known_ops()) {
    std::vector<Dims> points = {tiny(g.op)};
    Dims bigger = tiny(g.op);
    for (auto& [name, v] : bigger) v *= (name == "head_size" || name == "head_dim" || name == "k") ? 2 : 3;
    if (g.op == "topk_softmax") bigger["k"] = 3;
    points.push_back(bigger);
    for (const Dims& d : points) {
      for (DType t : {DType::bf16, DType::f32}) {
        SCOPED_TRACE(g.op + " " + dtype_name(t));
        const OpEntry& op = reg.op(g.op);
        const Case c = perfdb::case_at(g.op, d);
        std::vector<ArgPlan> plan = plan_case(op, c);
        PlainArgs a = make_plain(op, plan, input_masters(op, c, plan, t, 1), t, Device::cpu());
        const Cost real = op.cost(ArgList(op.name, op.args, a.values));
        const Cost est = perfdb::cost_at(g.op, dtype_name(t), d);
        EXPECT_EQ(est.bytes, real.bytes);
        EXPECT_EQ(est.flops, real.flops);
        EXPECT_GT(est.bytes, 0);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 15 * 2 * 2);
}

TEST(Collect, UnknownOpsAndDimsAreErrors) {
  try {
    perfdb::op_grid("rms_nrom");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_nrom"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rms_norm"), std::string::npos) << e.what();
  }
  try {
    perfdb::case_at("linear", {{"tokens", 4}, {"n", 8}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'k'"), std::string::npos) << e.what();
  }
  try {
    perfdb::cost_at("rms_norm", "bf16", {{"tokens", 4}, {"hidden", 8}, {"heads", 2}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'heads'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(perfdb::case_at("rms_norm", {{"tokens", 4}, {"hidden", 0}}), Error);
  EXPECT_THROW(perfdb::grid_points("rms_norm", "medium", DeviceKind::cpu), Error);
  EXPECT_THROW(perfdb::grid_points("softmax", "quick", DeviceKind::cpu), Error);
}

bool has_point(const std::vector<Dims>& pts, const Dims& d) {
  return std::find(pts.begin(), pts.end(), d) != pts.end();
}

TEST(Collect, GridsAreSortedCappedAndHoldTheModelShapes) {
  const perfdb::GridCap cpu_cap = perfdb::default_cap(DeviceKind::cpu, 20.0, 100.0);
  for (const char* grid : {"quick", "full"}) {
    for (DeviceKind dev : {DeviceKind::cpu, DeviceKind::cuda}) {
      const perfdb::GridCap cap = dev == DeviceKind::cpu ? cpu_cap : perfdb::default_cap(dev, 3000, 700000);
      for (const perfdb::OpGrid& g : perfdb::known_ops()) {
        SCOPED_TRACE(std::string(grid) + " " + device_kind_name(dev) + " " + g.op);
        const std::vector<Dims> pts = perfdb::grid_points(g.op, grid, dev, cap);
        ASSERT_FALSE(pts.empty());
        auto key = [&](const Dims& d) {
          std::vector<int64_t> k;
          for (const std::string& n : g.dims) k.push_back(d.at(n));
          return k;
        };
        for (size_t i = 1; i < pts.size(); ++i) EXPECT_LT(key(pts[i - 1]), key(pts[i]));
        if (dev != DeviceKind::cpu || std::string(grid) == "full") continue;  // the caps: CPU quick
        for (const Dims& d : pts) {
          const Cost c = perfdb::cost_at(g.op, "bf16", d);
          const bool keep = d.count("tokens") && (d.at("tokens") == 128 || d.at("tokens") == 512);
          EXPECT_LE(std::max(c.bytes / 20e9, c.flops / 100e9), keep ? cpu_cap.keep_max_seconds : cpu_cap.max_seconds);
          EXPECT_LE(perfdb::footprint_bytes(g.op, "bf16", d), cpu_cap.max_bytes);
        }
      }
    }
  }
  // Llama-3.1-8B at TP 1 and 8, the estimator's validation points, Qwen3-30B-A3B's experts at the
  // expected tokens per expert (512 * 8 / 128 = 32; 128 * 8 / 128 = 8).
  const auto gpu_linear = perfdb::grid_points("linear", "quick", DeviceKind::cuda);
  EXPECT_TRUE(has_point(gpu_linear, {{"tokens", 512}, {"n", 6144}, {"k", 4096}}));
  EXPECT_TRUE(has_point(gpu_linear, {{"tokens", 2048}, {"n", 4096}, {"k", 1792}}));
  EXPECT_TRUE(has_point(gpu_linear, {{"tokens", 8}, {"n", 1536}, {"k", 2048}}));
  EXPECT_TRUE(has_point(gpu_linear, {{"tokens", 3}, {"n", 2048}, {"k", 768}}) ||
              has_point(gpu_linear, {{"tokens", 4}, {"n", 2048}, {"k", 768}}));
  const auto decode = perfdb::grid_points("attention_decode", "quick", DeviceKind::cuda);
  for (int64_t b : {1, 32, 256})
    EXPECT_TRUE(has_point(decode, {{"batch", b}, {"context", 2048}, {"q_heads", 32}, {"kv_heads", 8}, {"head_dim", 128}}));
  const auto cpu_linear = perfdb::grid_points("linear", "quick", DeviceKind::cpu, cpu_cap);
  EXPECT_TRUE(has_point(cpu_linear, {{"tokens", 128}, {"n", 6144}, {"k", 4096}}));
  const auto full_tokens = perfdb::grid_points("rms_norm", "full", DeviceKind::cuda);
  EXPECT_TRUE(has_point(full_tokens, {{"tokens", 24576}, {"hidden", 8192}}));
}

TEST(Collect, RangesKeepThePointsInsideAndNameTheirDim) {
  // The full grid over part of the token range: every point of the full grid inside it, nothing
  // outside, and the quick grid's points there among them (a denser collection resumes on them).
  perfdb::GridCap cap;
  cap.only_ranges["tokens"] = {1, 4096};
  const auto full = perfdb::grid_points("rms_norm", "full", DeviceKind::cuda);
  const auto part = perfdb::grid_points("rms_norm", "full", DeviceKind::cuda, cap);
  const auto quick = perfdb::grid_points("rms_norm", "quick", DeviceKind::cuda, cap);
  size_t inside = 0;
  for (const Dims& d : full) inside += d.at("tokens") <= 4096;
  EXPECT_EQ(part.size(), inside);
  EXPECT_LT(part.size(), full.size());
  for (const Dims& d : part) EXPECT_LE(d.at("tokens"), 4096);
  EXPECT_TRUE(has_point(part, {{"tokens", 3072}, {"hidden", 4096}}));
  for (const Dims& d : quick) EXPECT_TRUE(has_point(part, d)) << d.at("tokens") << " " << d.at("hidden");
  // A dim the op does not have leaves its points alone; two dims both apply.
  perfdb::GridCap other;
  other.only_ranges["context"] = {1, 1};
  EXPECT_EQ(perfdb::grid_points("rms_norm", "quick", DeviceKind::cuda, other).size(),
            perfdb::grid_points("rms_norm", "quick", DeviceKind::cuda).size());
  perfdb::GridCap two;
  two.only_ranges["batch"] = {4, 16};
  two.only_ranges["context"] = {512, 2048};
  for (const Dims& d : perfdb::grid_points("attention_decode", "full", DeviceKind::cuda, two)) {
    EXPECT_TRUE(d.at("batch") >= 4 && d.at("batch") <= 16);
    EXPECT_TRUE(d.at("context") >= 512 && d.at("context") <= 2048);
  }
  // In a collection, a range of a dim no collected op has, or an empty range, is an error.
  perfdb::CollectOptions o;
  o.system = "test-system";
  o.root = (std::filesystem::temp_directory_path() / "opforge_collect_ranges").string();
  o.ops = {"rms_norm"};
  o.dry_run = true;
  o.progress = false;
  o.copy_gbps = 10;
  o.gemm_gflops = 50;
  o.notice = [](const std::string&) {};
  o.ranges["context"] = {1, 8};
  try {
    perfdb::collect(global_registry(), o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'context'"), std::string::npos) << e.what();
  }
  o.ranges.clear();
  o.ranges["tokens"] = {9, 3};
  EXPECT_THROW(perfdb::collect(global_registry(), o), Error);
  std::filesystem::remove_all(o.root);
}

std::string temp_root() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "opforge_collect_XXXXXX").string();
  char* dir = mkdtemp(tmpl.data());
  if (!dir) throw std::runtime_error("mkdtemp failed");
  return dir;
}

perfdb::CollectOptions tiny_collection(const std::string& root, std::vector<Dims> points) {
  perfdb::CollectOptions o;
  o.system = "test-system";
  o.root = root;
  o.ops = {"rms_norm", "gemma_rms_norm"};  // two ops with the same dims: their rows stay apart
  o.points["rms_norm"] = points;
  o.points["gemma_rms_norm"] = std::move(points);
  o.progress = false;
  o.harness = fast_options();
  o.samples = 1;  // not the CPU default of Note [samples on a shared CPU]: a fast test
  o.notice = [](const std::string&) {};
  o.copy_gbps = 10;  // the ceilings are the collector's to measure; given here to keep the test fast
  o.gemm_gflops = 50;
  return o;
}

// Note [passes over a line]: every point of a line is timed once per pass (the second pass runs
// the line backward), and the line's rows are written once, in grid order.
TEST(Collect, PassesOverALineWriteEachRowOnceInGridOrder) {
  const Registry& reg = global_registry();
  const std::string root = temp_root();
  const Dims a{{"tokens", 1}, {"hidden", 32}}, b{{"tokens", 3}, {"hidden", 32}}, c{{"tokens", 7}, {"hidden", 32}},
      other{{"tokens", 2}, {"hidden", 64}};
  perfdb::CollectOptions o = tiny_collection(root, {c, a, other, b});
  o.ops = {"rms_norm"};
  o.impls = {"cpu"};
  o.passes = 2;
  perfdb::CollectSummary s = perfdb::collect(reg, o);
  EXPECT_EQ(s.measured, 4);
  perfdb::OpTable t = perfdb::read_table(root + "/test-system/rms_norm.csv");
  ASSERT_EQ(t.rows.size(), 4u);
  std::vector<std::pair<int64_t, int64_t>> order;
  for (const perfdb::Row& r : t.rows) {
    order.push_back({r.dims.at("hidden"), r.dims.at("tokens")});
    EXPECT_GT(r.median_us, 0);
  }
  EXPECT_EQ(order, (std::vector<std::pair<int64_t, int64_t>>{{32, 1}, {32, 3}, {32, 7}, {64, 2}}));
  std::filesystem::remove_all(root);
}

TEST(Collect, ReplaceMeasuresTheSelectedPointsAgainAndKeepsTheRest) {
  const Registry& reg = global_registry();
  const std::string root = temp_root();
  const Dims a{{"tokens", 2}, {"hidden", 16}}, b{{"tokens", 5}, {"hidden", 16}};
  perfdb::CollectOptions o = tiny_collection(root, {a, b});
  o.ops = {"rms_norm"};
  o.impls = {"cpu"};
  perfdb::collect(reg, o);
  const std::string path = root + "/test-system/rms_norm.csv";
  // Mark the stored rows so that a re-measured one is told apart from a kept one.
  perfdb::OpTable t = perfdb::read_table(path);
  ASSERT_EQ(t.rows.size(), 2u);
  for (perfdb::Row& r : t.rows) r.median_us = 12345.0;
  perfdb::write_table(t, path);

  perfdb::CollectOptions again = tiny_collection(root, {b});
  again.ops = {"rms_norm"};
  again.impls = {"cpu"};
  perfdb::CollectSummary plain = perfdb::collect(reg, again);  // without --replace: resumes, nothing to do
  EXPECT_EQ(plain.measured, 0);
  EXPECT_EQ(plain.already_present, 1);
  again.replace = true;
  perfdb::CollectSummary s = perfdb::collect(reg, again);
  EXPECT_EQ(s.measured, 1);
  EXPECT_EQ(s.already_present, 0);
  t = perfdb::read_table(path);
  ASSERT_EQ(t.rows.size(), 2u);
  for (const perfdb::Row& r : t.rows) {
    if (r.dims.at("tokens") == 2) EXPECT_EQ(r.median_us, 12345.0);  // not selected: kept
    else EXPECT_NE(r.median_us, 12345.0);                          // selected: measured again
  }
  ASSERT_TRUE(t.header.extra.count("recollected"));
  const std::string& note = t.header.extra.at("recollected");
  EXPECT_NE(note.find("1 points on "), std::string::npos) << note;
  EXPECT_NE(note.find("1 of them replacing stored rows"), std::string::npos) << note;
  std::filesystem::remove_all(root);
}

TEST(Collect, WritesRowsAndResumesWithoutRepeatingThem) {
  const Registry& reg = global_registry();
  const std::string root = temp_root();
  int cpu_kernels = 0;  // of both ops
  for (const char* op : {"rms_norm", "gemma_rms_norm"})
    for (const KernelEntry& k : reg.op(op).kernels)
      cpu_kernels += k.desc.device == DeviceKind::cpu && !k.is_reference() && k.availability().ok;
  ASSERT_GT(cpu_kernels, 1);
  const Dims a{{"tokens", 2}, {"hidden", 16}}, b{{"tokens", 5}, {"hidden", 16}};

  // An "interrupted" run that measured one point, then the full run: only the other is added.
  perfdb::CollectSummary s1 = perfdb::collect(reg, tiny_collection(root, {a}));
  EXPECT_EQ(s1.measured, cpu_kernels);
  perfdb::CollectSummary s2 = perfdb::collect(reg, tiny_collection(root, {a, b}));
  EXPECT_EQ(s2.measured, cpu_kernels);
  EXPECT_EQ(s2.already_present, cpu_kernels);
  perfdb::CollectSummary s3 = perfdb::collect(reg, tiny_collection(root, {a, b}));
  EXPECT_EQ(s3.measured, 0);
  EXPECT_EQ(s3.already_present, 2 * cpu_kernels);

  const std::string path = root + "/test-system/rms_norm.csv";
  perfdb::OpTable t = perfdb::read_table(path);
  EXPECT_EQ(t.header.system, "test-system");
  EXPECT_EQ(t.header.op, "rms_norm");
  EXPECT_EQ(t.header.device, perfdb::cpu_device_name());
  EXPECT_EQ(t.header.ceiling_gbps, 10);
  EXPECT_EQ(t.header.ceiling_gflops, 50);
  EXPECT_EQ(t.header.axes, std::vector<std::string>{"tokens"});
  EXPECT_EQ(t.dim_names, (std::vector<std::string>{"tokens", "hidden"}));
  ASSERT_EQ(t.rows.size() + perfdb::read_table(root + "/test-system/gemma_rms_norm.csv").rows.size(),
            size_t(2 * cpu_kernels));
  for (const perfdb::Row& r : t.rows) {
    EXPECT_EQ(r.dtype, "bf16");
    EXPECT_GT(r.median_us, 0);
    const Cost c = perfdb::cost_at("rms_norm", "bf16", r.dims);
    EXPECT_EQ(r.bytes, c.bytes);
    EXPECT_FALSE(r.energy_uj.has_value());  // no power sampling on the CPU
  }
  // The kernels' plans are stored (Note [plan regimes]): the cpu rms_norm notes its thread
  // decision at every point (its streaming one only for rows of whole 64-byte lines).
  EXPECT_TRUE(t.has_plan);
  for (const perfdb::Row& r : t.rows) {
    if (r.impl != "cpu") continue;
    std::set<std::string> keys;
    for (const plan::Decision& d : r.plan) keys.insert(d.key);
    if (cpu::cpu_info().threads > 1) {
      EXPECT_TRUE(keys.count("threads")) << plan::to_text(r.plan);
    }
  }

  // A file from another device: an error that says what to do, and the file is left alone.
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::string changed = text.str();
  const size_t at = changed.find("# device: ");
  ASSERT_NE(at, std::string::npos);
  changed.insert(at + 10, "Other ");
  std::ofstream(path) << changed;
  try {
    perfdb::collect(reg, tiny_collection(root, {a, b}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("remove the file"), std::string::npos) << e.what();
  }
  perfdb::CollectOptions bad_name = tiny_collection(root, {a});
  bad_name.system = "../elsewhere";
  EXPECT_THROW(perfdb::collect(reg, bad_name), Error);
  if (!device_memory_ops(DeviceKind::cuda)) {  // a build without CUDA says so
    perfdb::CollectOptions cuda = tiny_collection(root, {a});
    cuda.device = DeviceKind::cuda;
    EXPECT_THROW(perfdb::collect(reg, cuda), Error);
  }
  std::stringstream after;
  after << std::ifstream(path).rdbuf();
  EXPECT_EQ(after.str(), changed);
  std::filesystem::remove_all(root);
}

}  // namespace
