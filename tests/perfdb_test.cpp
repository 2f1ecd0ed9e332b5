// The performance database: file format and validation, the query rule (measured, interpolated,
// bilinear, extrapolated, too far, never another op's data), "auto", read-only queries and
// leave-one-out. Every file lives in a fresh temporary folder; the cost model is a synthetic one
// passed through Database::set_cost_model.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "opforge/perfdb.h"

namespace fs = std::filesystem;
using namespace opforge;
using namespace opforge::perfdb;

namespace {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("opforge_perfdb_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

FileHeader header(const std::string& system, const std::string& op, std::vector<std::string> axes,
                  double gbps = 20, double gflops = 0) {
  FileHeader h;
  h.system = system;
  h.op = op;
  h.device = "test device (2 threads)";
  h.commit = "abc1234";
  h.date = "2026-11-26";
  h.ceiling_gbps = gbps;
  h.ceiling_gflops = gflops;
  h.axes = std::move(axes);
  return h;
}

Row row(const std::string& impl, const std::string& dtype, Dims dims, double us, double bytes = 0, double flops = 0,
        std::optional<double> energy = std::nullopt) {
  Row r;
  r.impl = impl;
  r.dtype = dtype;
  r.dims = std::move(dims);
  r.median_us = us;
  r.bytes = bytes;
  r.flops = flops;
  r.energy_uj = energy;
  return r;
}

const std::vector<int64_t> kTokens = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

// t = a * tokens^p per hidden, energy = 3 * tokens^0.5.
OpTable power_law_table(const std::string& system, const std::string& impl = "cpu", double a = 0.5,
                        double p = 0.8) {
  OpTable t;
  t.header = header(system, "rms_norm", {"tokens"});
  t.dim_names = {"tokens", "hidden"};
  for (int64_t h : {4096, 8192})
    for (int64_t tok : kTokens)
      t.rows.push_back(row(impl, "bf16", {{"tokens", tok}, {"hidden", h}}, a * (h / 4096.0) * std::pow(double(tok), p),
                           4.0 * tok * h, 4.0 * tok * h, 3 * std::sqrt(double(tok))));
  return t;
}

// bytes = 2 * tokens * hidden, no flops: memory-bound synthetic cost model.
CostFn bytes_model() {
  return [](const std::string&, const std::string&, const Dims& d) {
    Cost c;
    c.bytes = 2.0 * double(d.at("tokens")) * double(d.at("hidden"));
    c.flops = 10.0 * double(d.at("tokens")) * double(d.at("hidden"));
    return c;
  };
}

template <class F>
std::string error_of(F&& f, ErrorCode expect = ErrorCode::not_available) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expect) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

template <class F>
std::string unavailable(F&& f) {
  try {
    f();
  } catch (const PerfDataNotAvailable& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not PerfDataNotAvailable: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no PerfDataNotAvailable";
  return "";
}

}  // namespace

// ---- the file format ---------------------------------------------------------------------------

TEST(PerfdbTable, WriteReadRoundTrip) {
  TempDir dir;
  OpTable t;
  t.header = header("sysA", "attention_decode", {"batch", "context"}, 3352.5, 989000.25);
  t.header.extra["grid"] = "quick";
  t.dim_names = {"batch", "context", "q_heads", "kv_heads", "head_dim"};
  t.rows.push_back(row("cuda", "bf16", {{"batch", 1}, {"context", 2048}, {"q_heads", 32}, {"kv_heads", 8}, {"head_dim", 128}},
                       0.1, 16392, 1e-7, 123456.789));
  t.rows.push_back(row("cuda", "f16", {{"batch", 32}, {"context", 2048}, {"q_heads", 32}, {"kv_heads", 8}, {"head_dim", 128}},
                       1.0 / 3.0, 0, 24576));
  std::string path = dir / "sysA/attention_decode.csv";
  write_table(t, path);
  OpTable back = read_table(path);
  EXPECT_EQ(back.path, path);
  EXPECT_EQ(back.header.version, kFormatVersion);
  EXPECT_EQ(back.header.system, "sysA");
  EXPECT_EQ(back.header.op, "attention_decode");
  EXPECT_EQ(back.header.device, t.header.device);
  EXPECT_EQ(back.header.commit, "abc1234");
  EXPECT_EQ(back.header.date, "2026-11-26");
  EXPECT_EQ(back.header.ceiling_gbps, 3352.5);
  EXPECT_EQ(back.header.ceiling_gflops, 989000.25);
  EXPECT_EQ(back.header.axes, t.header.axes);
  EXPECT_EQ(back.header.extra, t.header.extra);
  EXPECT_EQ(back.dim_names, t.dim_names);
  ASSERT_EQ(back.rows.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.rows[i].impl, t.rows[i].impl);
    EXPECT_EQ(back.rows[i].dtype, t.rows[i].dtype);
    EXPECT_EQ(back.rows[i].dims, t.rows[i].dims);
    EXPECT_EQ(back.rows[i].median_us, t.rows[i].median_us);  // shortest round-trip formatting
    EXPECT_EQ(back.rows[i].bytes, t.rows[i].bytes);
    EXPECT_EQ(back.rows[i].flops, t.rows[i].flops);
    EXPECT_EQ(back.rows[i].energy_uj, t.rows[i].energy_uj);
  }
  EXPECT_EQ(read_file(path).rfind("# opforge-perfdb 1\n", 0), 0u);
}

TEST(PerfdbTable, AppendRows) {
  TempDir dir;
  OpTable t = power_law_table("sysA");
  std::vector<Row> later(t.rows.end() - 3, t.rows.end());
  t.rows.resize(t.rows.size() - 3);
  std::string path = dir / "rms_norm.csv";
  write_table(t, path);
  append_rows(path, t.dim_names, later);
  EXPECT_EQ(read_table(path).rows.size(), t.rows.size() + 3);
  std::string before = read_file(path);
  EXPECT_NE(error_of([&] { append_rows(path, t.dim_names, {later[0]}); }, ErrorCode::invalid_argument)
                .find("already stored"), std::string::npos);
  EXPECT_NE(error_of([&] { append_rows(path, {"hidden", "tokens"}, {}); }, ErrorCode::invalid_argument)
                .find("the file has dims tokens,hidden"), std::string::npos);
  EXPECT_EQ(read_file(path), before);
}

TEST(PerfdbTable, WriteRejectsBadTables) {
  TempDir dir;
  OpTable t = power_law_table("sysA");
  t.header.axes = {"batch"};
  error_of([&] { write_table(t, dir / "x.csv"); }, ErrorCode::invalid_argument);
  t = power_law_table("sysA");
  t.rows.push_back(t.rows[0]);
  error_of([&] { write_table(t, dir / "x.csv"); }, ErrorCode::invalid_argument);
  t = power_law_table("sysA");
  t.rows[3].median_us = 0;
  error_of([&] { write_table(t, dir / "x.csv"); }, ErrorCode::invalid_argument);
  EXPECT_FALSE(fs::exists(dir / "x.csv"));
}

namespace {
const std::string kHead =
    "# opforge-perfdb 1\n# system: sysA\n# op: rms_norm\n# device: cpu\n# commit: abc\n# date: 2026-11-26\n"
    "# ceiling_gbps: 20\n# ceiling_gflops: 100\n# axes: tokens\n";
const std::string kColumns = "impl,dtype,tokens,hidden,median_us,bytes,flops,energy_uj\n";
const std::string kGood = "cpu,bf16,1,4096,0.9,16392,24576,\n";

struct Malformed {
  const char* name;
  std::string text;
  int line;
  const char* says;
};
}  // namespace

TEST(PerfdbTable, MalformedFilesNameFileAndLine) {
  const std::vector<Malformed> cases = {
      {"empty", "", 1, "empty file"},
      {"no magic", "opforge-perfdb 1\n" + kColumns, 1, "expected '# opforge-perfdb 1'"},
      {"other version", "# opforge-perfdb 2\n" + kHead.substr(19) + kColumns, 1, "format version 2 is not supported"},
      {"missing key", kHead.substr(0, kHead.find("# axes")) + kColumns + kGood, 9, "header key 'axes' missing"},
      {"no column header", kHead, 10, "column header is missing"},
      {"key twice", kHead + "# op: x\n" + kColumns, 10, "repeated"},
      {"not key: value", kHead + "# just a comment\n" + kColumns, 10, "expected '# key: value'"},
      {"bad gbps", kHead.substr(0, kHead.find("# ceiling_gbps")) + "# ceiling_gbps: fast\n# ceiling_gflops: 1\n# axes: tokens\n" + kColumns,
       7, "ceiling_gbps"},
      {"axis not a column", kHead.substr(0, kHead.find("# axes")) + "# axes: batch\n" + kColumns, 9, "axis 'batch'"},
      {"three axes", kHead.substr(0, kHead.find("# axes")) + "# axes: a, b, c\n" + kColumns, 9, "1 or 2 dims"},
      {"bad column header", kHead + "impl,dtype,tokens,hidden,median_us,bytes,flops\n", 10, "column header"},
      {"no dims", kHead + "impl,dtype,median_us,bytes,flops,energy_uj\n", 10, "column header"},
      {"dim twice", kHead + "impl,dtype,tokens,tokens,median_us,bytes,flops,energy_uj\n", 10, "twice"},
      {"header after columns", kHead + kColumns + "# late: 1\n", 11, "after the column header"},
      {"too few fields", kHead + kColumns + "cpu,bf16,1,4096,0.9,16392,24576\n", 11, "expected 8 fields, got 7"},
      {"too many fields", kHead + kColumns + kGood + "cpu,bf16,2,4096,0.9,16392,24576,,\n", 12, "expected 8 fields, got 9"},
      {"dim zero", kHead + kColumns + "cpu,bf16,0,4096,0.9,16392,24576,\n", 11, "dim tokens must be an integer > 0"},
      {"dim negative", kHead + kColumns + "cpu,bf16,-1,4096,0.9,16392,24576,\n", 11, "dim tokens"},
      {"dim not integer", kHead + kColumns + "cpu,bf16,1,4096.5,0.9,16392,24576,\n", 11, "dim hidden"},
      {"dim trailing text", kHead + kColumns + "cpu,bf16,1x,4096,0.9,16392,24576,\n", 11, "dim tokens"},
      {"median zero", kHead + kColumns + "cpu,bf16,1,4096,0,16392,24576,\n", 11, "median_us"},
      {"median nan", kHead + kColumns + "cpu,bf16,1,4096,nan,16392,24576,\n", 11, "median_us"},
      {"median inf", kHead + kColumns + "cpu,bf16,1,4096,inf,16392,24576,\n", 11, "median_us"},
      {"median overflow", kHead + kColumns + "cpu,bf16,1,4096,1e999,16392,24576,\n", 11, "median_us"},
      {"median empty", kHead + kColumns + "cpu,bf16,1,4096,,16392,24576,\n", 11, "median_us"},
      {"median trailing", kHead + kColumns + "cpu,bf16,1,4096,0.9us,16392,24576,\n", 11, "median_us"},
      {"bytes negative", kHead + kColumns + "cpu,bf16,1,4096,0.9,-1,24576,\n", 11, "bytes"},
      {"flops text", kHead + kColumns + "cpu,bf16,1,4096,0.9,16392,many,\n", 11, "flops"},
      {"energy negative", kHead + kColumns + "cpu,bf16,1,4096,0.9,16392,24576,-3\n", 11, "energy_uj"},
      {"energy text", kHead + kColumns + "cpu,bf16,1,4096,0.9,16392,24576,x\n", 11, "energy_uj"},
      {"unknown dtype", kHead + kColumns + kGood + "cpu,bf17,1,4096,0.9,16392,24576,\n", 12, "unknown dtype 'bf17'"},
      {"empty impl", kHead + kColumns + ",bf16,1,4096,0.9,16392,24576,\n", 11, "impl"},
      {"duplicate row", kHead + kColumns + kGood + "cpu,bf16,2,4096,1.9,16392,24576,\n" + kGood, 13,
       "duplicate row cpu,bf16,1,4096 (first on line 11)"},
      {"duplicate via alias", kHead + kColumns + kGood + "cpu,bfloat16,1,4096,0.8,16392,24576,\n", 12, "duplicate row"},
      {"torn last line", kHead + kColumns + kGood + "cpu,bf16,2,4096,1.9,163", 12, "no line end"},
  };
  TempDir dir;
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir / (std::string("t_") + std::to_string(&c - cases.data()) + ".csv");
    write_file(path, c.text);
    std::string msg = error_of([&] { read_table(path); }, ErrorCode::parse);
    EXPECT_EQ(msg.rfind(path + ":" + std::to_string(c.line) + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
  }
  std::string missing = dir / "missing.csv";
  EXPECT_NE(error_of([&] { read_table(missing); }, ErrorCode::io).find(missing), std::string::npos);
}

TEST(PerfdbTable, AcceptsAliasesBlankLinesAndCrlf) {
  TempDir dir;
  std::string path = dir / "ok.csv";
  std::string text = kHead + kColumns + kGood + "\ncpu,bfloat16,2,4096,1.5,1,2,7.5\r\n";
  write_file(path, text);
  OpTable t = read_table(path);
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[1].dtype, "bf16");
  EXPECT_EQ(t.rows[1].energy_uj, 7.5);
  EXPECT_FALSE(t.rows[0].energy_uj.has_value());
}

// ---- loading -----------------------------------------------------------------------------------

TEST(PerfdbDatabase, LoadSystemsAndRoots) {
  TempDir dir;
  std::string perf = dir / "data/perf";
  write_table(power_law_table("sysA"), perf + "/sysA/rms_norm.csv");
  write_table(power_law_table("sysB"), perf + "/sysB/rms_norm.csv");
  EXPECT_EQ(Database::systems(perf), (std::vector<std::string>{"sysA", "sysB"}));
  EXPECT_EQ(Database::systems(dir.str()), (std::vector<std::string>{"sysA", "sysB"}));  // a checkout
  Database db = Database::load("sysA", dir.str());
  EXPECT_EQ(db.system(), "sysA");
  EXPECT_EQ(db.ops(), std::vector<std::string>{"rms_norm"});
  EXPECT_TRUE(db.has_op("rms_norm"));
  EXPECT_EQ(db.table("rms_norm").rows.size(), 2 * kTokens.size());

  ::setenv("OPFORGE_PERF_DATA", perf.c_str(), 1);
  EXPECT_EQ(Database::resolve_root(), perf);
  EXPECT_EQ(Database::load("sysB").ops(), std::vector<std::string>{"rms_norm"});
  ::unsetenv("OPFORGE_PERF_DATA");

  std::string msg = unavailable([&] { Database::load("sysC", perf); });
  EXPECT_NE(msg.find("'sysC'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sysA, sysB"), std::string::npos) << msg;
}

TEST(PerfdbDatabase, LoadChecksFileAgainstFolder) {
  TempDir dir;
  write_table(power_law_table("sysB"), dir / "sysA/rms_norm.csv");
  std::string msg = error_of([&] { Database::load("sysA", dir.str()); }, ErrorCode::parse);
  EXPECT_NE(msg.find(dir / "sysA/rms_norm.csv:2:"), std::string::npos) << msg;
  TempDir dir2;
  write_table(power_law_table("sysA"), dir2 / "sysA/layer_norm.csv");
  msg = error_of([&] { Database::load("sysA", dir2.str()); }, ErrorCode::parse);
  EXPECT_NE(msg.find("layer_norm.csv:3:"), std::string::npos) << msg;
  TempDir dir3;  // a malformed file anywhere fails the load
  write_table(power_law_table("sysA"), dir3 / "sysA/rms_norm.csv");
  write_file(dir3 / "sysA/silu_and_mul.csv", "# opforge-perfdb 3\n");
  msg = error_of([&] { Database::load("sysA", dir3.str()); }, ErrorCode::parse);
  EXPECT_NE(msg.find("silu_and_mul.csv:1:"), std::string::npos) << msg;
}

// ---- the query rule ----------------------------------------------------------------------------

class PerfdbQuery : public ::testing::Test {
 protected:
  void SetUp() override {
    OpTable t = power_law_table("sysA");
    for (Row& r : t.rows) {  // exact roofline fraction 0.5 for the extrapolation tests
      Cost c = bytes_model()("rms_norm", "bf16", r.dims);
      r.bytes = c.bytes;
      r.flops = c.flops;
    }
    // reference: 10x slower, and the only impl with hidden=2048
    OpTable ref = power_law_table("sysA", "reference", 5.0);
    for (Row& r : ref.rows) t.rows.push_back(r);
    t.rows.push_back(row("reference", "bf16", {{"tokens", 64}, {"hidden", 2048}}, 3.0));
    t.rows.push_back(row("cpu", "f32", {{"tokens", 64}, {"hidden", 4096}}, 3.0));
    write_table(t, dir / "sysA/rms_norm.csv");
    db = Database::load("sysA", dir.str());
    db.set_cost_model(bytes_model());
  }
  TempDir dir;
  Database db;
};

TEST_F(PerfdbQuery, Measured) {
  Answer a = db.query("rms_norm", "cpu", "bf16", {{"tokens", 512}, {"hidden", 8192}});
  EXPECT_EQ(a.method, Method::measured);
  EXPECT_EQ(a.how, "measured");
  EXPECT_EQ(a.impl, "cpu");
  EXPECT_DOUBLE_EQ(a.us, 0.5 * 2 * std::pow(512.0, 0.8));
  ASSERT_TRUE(a.energy_uj);
  EXPECT_DOUBLE_EQ(*a.energy_uj, 3 * std::sqrt(512.0));
  EXPECT_EQ(db.query("rms_norm", "cpu", "bfloat16", {{"tokens", 512}, {"hidden", 8192}}).us, a.us);
}

TEST_F(PerfdbQuery, InterpolatedIsExactOnPowerLaws) {
  for (int64_t tok : {3, 100, 700, 1000}) {
    Answer a = db.query("rms_norm", "cpu", "bf16", {{"tokens", tok}, {"hidden", 4096}});
    EXPECT_EQ(a.method, Method::interpolated);
    EXPECT_NEAR(a.us / (0.5 * std::pow(double(tok), 0.8)), 1.0, 1e-12) << tok;
    ASSERT_TRUE(a.energy_uj);
    EXPECT_NEAR(*a.energy_uj / (3 * std::sqrt(double(tok))), 1.0, 1e-12);
  }
  EXPECT_EQ(db.query("rms_norm", "cpu", "bf16", {{"tokens", 700}, {"hidden", 4096}}).how,
            "interpolated in tokens between 512 and 1024 (monotone cubic in log-log)");
  // the formula, by hand, on two points: log t linear in log tokens
  double t512 = 0.5 * std::pow(512.0, 0.8), t1024 = 0.5 * std::pow(1024.0, 0.8);
  double w = (std::log(700.0) - std::log(512.0)) / (std::log(1024.0) - std::log(512.0));
  EXPECT_NEAR(db.query("rms_norm", "cpu", "bf16", {{"tokens", 700}, {"hidden", 4096}}).us,
              std::exp((1 - w) * std::log(t512) + w * std::log(t1024)), 1e-9);
}

TEST_F(PerfdbQuery, ExtrapolatedHoldsRooflineFraction) {
  // stored: t = 0.5 tokens^0.8 (not roofline-shaped); beyond the grid the fraction at 1024 is held.
  Dims q = {{"tokens", 2048}, {"hidden", 4096}};
  Answer a = db.query("rms_norm", "cpu", "bf16", q);
  EXPECT_EQ(a.method, Method::extrapolated);
  double t1024 = 0.5 * std::pow(1024.0, 0.8);
  double roof = [&](int64_t tok) { return 2.0 * tok * 4096 / (20 * 1e3); }(1024);
  double fraction = roof / t1024;
  EXPECT_NEAR(a.us, t1024 * 2.0, 1e-9);  // bytes double, the fraction stays
  EXPECT_NE(a.how.find("extrapolated in tokens from 1024 (2.0x beyond)"), std::string::npos) << a.how;
  EXPECT_NE(a.how.find(fmt::format("roofline fraction {:.2f} held", fraction)), std::string::npos) << a.how;
  ASSERT_TRUE(a.energy_uj);
  EXPECT_NEAR(*a.energy_uj, 3 * std::sqrt(1024.0) * 2.0, 1e-9);
  // exactly 4x is allowed, below the smallest too
  EXPECT_NEAR(db.query("rms_norm", "cpu", "bf16", {{"tokens", 4096}, {"hidden", 4096}}).us, t1024 * 4, 1e-9);
  Answer low = db.query("rms_norm", "cpu", "bf16", {{"tokens", 1}, {"hidden", 4096}});
  EXPECT_EQ(low.method, Method::measured);
}

TEST_F(PerfdbQuery, ExtrapolationUsesTheFlopsBoundWhenItDominates) {
  OpTable t = power_law_table("sysF");
  t.header.ceiling_gflops = 1;  // 10 flops per element at 1 GFLOP/s: compute-bound
  write_table(t, dir / "sysF/rms_norm.csv");
  Database f = Database::load("sysF", dir.str());
  f.set_cost_model([](const std::string&, const std::string&, const Dims& d) {
    Cost c;
    c.bytes = double(d.at("tokens"));
    c.flops = 10.0 * double(d.at("tokens")) * double(d.at("tokens"));  // quadratic in tokens
    return c;
  });
  Answer a = f.query("rms_norm", "cpu", "bf16", {{"tokens", 3072}, {"hidden", 4096}});
  EXPECT_NEAR(a.us, 0.5 * std::pow(1024.0, 0.8) * 9.0, 1e-9);
}

TEST_F(PerfdbQuery, TooFarIsNotAvailable) {
  std::string msg = unavailable([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 4097}, {"hidden", 4096}}); });
  EXPECT_NE(msg.find("tokens=4097"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at most 4x"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stored tokens: 1, 2, 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sysA"), std::string::npos) << msg;
  // below the smallest: a table starting at 16
  OpTable t = power_law_table("sysL");
  std::erase_if(t.rows, [](const Row& r) { return r.dims.at("tokens") < 16; });
  write_table(t, dir / "sysL/rms_norm.csv");
  Database l = Database::load("sysL", dir.str());
  l.set_cost_model(bytes_model());
  Answer a = l.query("rms_norm", "cpu", "bf16", {{"tokens", 4}, {"hidden", 4096}});
  EXPECT_EQ(a.method, Method::extrapolated);
  EXPECT_NE(a.how.find("from 16 (4.0x below)"), std::string::npos) << a.how;
  msg = unavailable([&] { l.query("rms_norm", "cpu", "bf16", {{"tokens", 3}, {"hidden", 4096}}); });
  EXPECT_NE(msg.find("below the smallest stored tokens 16"), std::string::npos) << msg;
}

TEST_F(PerfdbQuery, NonAxisDimsFarFromEveryStoredShape) {
  std::string msg = unavailable([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 64}, {"hidden", 50000}}); });
  EXPECT_NE(msg.find("hidden=50000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nearest stored: hidden=8192; hidden=4096"), std::string::npos) << msg;
  EXPECT_NE(msg.find("impl 'cpu'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dtype 'bf16'"), std::string::npos) << msg;
}

TEST_F(PerfdbQuery, UnknownNamesAreNotAvailable) {
  Dims q = {{"tokens", 64}, {"hidden", 4096}};
  EXPECT_NE(unavailable([&] { db.query("layer_norm", "cpu", "bf16", q); }).find("'layer_norm'"), std::string::npos);
  EXPECT_NE(unavailable([&] { db.query("rms_norm", "cuda", "bf16", q); }).find("impl 'cuda'"), std::string::npos);
  EXPECT_NE(unavailable([&] { db.query("rms_norm", "cpu", "f16", q); }).find("dtype 'f16'"), std::string::npos);
  EXPECT_NE(unavailable([&] { db.query("rms_norm", "auto", "f16", q); }).find("dtype 'f16'"), std::string::npos);
  EXPECT_NE(unavailable([&] { db.query("rms_norm", "cpu", "bf17", q); }).find("'bf17'"), std::string::npos);
  EXPECT_NE(unavailable([&] { Database::load("nowhere", dir.str()); }).find("'nowhere'"), std::string::npos);
  EXPECT_NE(unavailable([&] { db.table("layer_norm"); }).find("layer_norm"), std::string::npos);
  // other dims than the stored ones: not available, naming the dim; a dim <= 0 is a bad argument
  EXPECT_NE(unavailable([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 64}}); }).find("without dim 'hidden'"),
            std::string::npos);
  EXPECT_NE(unavailable([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 64}, {"hidden", 4096}, {"x", 1}}); })
                .find("by dim 'x'"), std::string::npos);
  error_of([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 0}, {"hidden", 4096}}); }, ErrorCode::invalid_argument);
}

TEST_F(PerfdbQuery, AutoPicksTheFastestThatCanAnswer) {
  Answer a = db.query("rms_norm", "auto", "bf16", {{"tokens", 100}, {"hidden", 4096}});
  EXPECT_EQ(a.impl, "cpu");
  EXPECT_NEAR(a.us, 0.5 * std::pow(100.0, 0.8), 1e-9);
  Answer r = db.query("rms_norm", "auto", "bf16", {{"tokens", 64}, {"hidden", 2048}});
  EXPECT_EQ(r.impl, "reference");
  EXPECT_EQ(r.us, 3.0);
  EXPECT_EQ(db.query("rms_norm", "reference", "bf16", {{"tokens", 100}, {"hidden", 4096}}).impl, "reference");
  std::string msg = unavailable([&] { db.query("rms_norm", "auto", "bf16", {{"tokens", 100}, {"hidden", 40000}}); });
  EXPECT_NE(msg.find("cpu: no stored row"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reference: no stored row"), std::string::npos) << msg;
}

TEST(PerfdbQueryShapes, AutoPrefersTheStoredShapeToAFasterScaledOne) {
  // "cpu" holds hidden 4096 and 8192, "reference" (10x slower) only hidden 3000: at 3000 the
  // cpu rows scaled by the roofline would be faster, but the impl holding the shape answers.
  TempDir dir;
  OpTable t = power_law_table("sysS");
  for (int64_t tok : kTokens)
    t.rows.push_back(row("reference", "bf16", {{"tokens", tok}, {"hidden", 3000}}, 5.0 * std::pow(double(tok), 0.8)));
  write_table(t, dir / "sysS/rms_norm.csv");
  Database db = Database::load("sysS", dir.str());
  db.set_cost_model(bytes_model());
  Answer a = db.query("rms_norm", "auto", "bf16", {{"tokens", 64}, {"hidden", 3000}});
  EXPECT_EQ(a.impl, "reference");
  EXPECT_EQ(a.method, Method::measured);
  EXPECT_LT(db.query("rms_norm", "cpu", "bf16", {{"tokens", 64}, {"hidden", 3000}}).us, a.us);
  // where no impl holds the shape, the fastest scaled answer
  Answer b = db.query("rms_norm", "auto", "bf16", {{"tokens", 64}, {"hidden", 3500}});
  EXPECT_EQ(b.impl, "cpu");
  EXPECT_EQ(b.method, Method::extrapolated);
}

TEST_F(PerfdbQuery, ShapeOffTheGridHoldsRooflineFraction) {
  // hidden=3000 is stored nowhere: the nearest stored shape (4096, within 4x) answers for the
  // tokens axis, scaled by the roofline times (bytes and flops both go as hidden here).
  Answer a = db.query("rms_norm", "cpu", "bf16", {{"tokens", 100}, {"hidden", 3000}});
  EXPECT_EQ(a.method, Method::extrapolated);
  EXPECT_NEAR(a.us, 0.5 * std::pow(100.0, 0.8) * 3000.0 / 4096.0, 1e-9);
  EXPECT_NE(a.how.find("interpolated in tokens between"), std::string::npos) << a.how;
  EXPECT_NE(a.how.find("shape scaled from hidden=4096 to hidden=3000 by the roofline time (0.732x"),
            std::string::npos) << a.how;
  ASSERT_TRUE(a.energy_uj);
  EXPECT_NEAR(*a.energy_uj, 3 * std::sqrt(100.0) * 3000.0 / 4096.0, 1e-9);
  // between two stored shapes: log time linear in log hidden (exact here, t ~ hidden)
  Answer m = db.query("rms_norm", "cpu", "bf16", {{"tokens", 512}, {"hidden", 6000}});
  EXPECT_EQ(m.method, Method::interpolated);
  EXPECT_NEAR(m.us, 0.5 * std::pow(512.0, 0.8) * 6000.0 / 4096.0, 1e-9);
  EXPECT_EQ(m.how, "measured at hidden=4096 and measured at hidden=8192; shape interpolated in hidden between 4096 "
                   "and 8192 (linear in log-log)");
  EXPECT_EQ(db.query("rms_norm", "cpu", "bf16", {{"tokens", 2048}, {"hidden", 6000}}).method, Method::extrapolated);
  // auto: the fastest of the scaled answers (cpu; the reference is 10x slower)
  Answer best = db.query("rms_norm", "auto", "bf16", {{"tokens", 100}, {"hidden", 3000}});
  EXPECT_EQ(best.impl, "cpu");
  EXPECT_EQ(best.us, a.us);
  // more than 4x from every stored shape: not available, naming the nearest stored ones
  std::string far = unavailable([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 100}, {"hidden", 33000}}); });
  EXPECT_NE(far.find("no stored row with hidden=33000 (nearest stored: hidden=8192"), std::string::npos) << far;
  unavailable([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 100}, {"hidden", 1000}}); });
  // the axis rule still applies on the scaled shape: tokens more than 4x past the grid
  unavailable([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 1000000}, {"hidden", 3000}}); });
}

TEST_F(PerfdbQuery, CostModelFailureIsNotAvailable) {
  db.set_cost_model([](const std::string& op, const std::string&, const Dims&) -> Cost {
    throw Error(ErrorCode::not_available, "no cost model for " + op);
  });
  std::string msg = unavailable([&] { db.query("rms_norm", "cpu", "bf16", {{"tokens", 2048}, {"hidden", 4096}}); });
  EXPECT_NE(msg.find("no cost model for rms_norm"), std::string::npos) << msg;
  EXPECT_EQ(db.query("rms_norm", "cpu", "bf16", {{"tokens", 100}, {"hidden", 4096}}).method, Method::interpolated);
}

TEST_F(PerfdbQuery, QueriesNeverWrite) {
  std::string path = dir / "sysA/rms_norm.csv";
  std::string before = read_file(path);
  auto mtime = fs::last_write_time(path);
  for (int64_t tok : {1, 100, 1024, 2048, 100000}) {
    for (const char* impl : {"auto", "cpu", "reference", "cuda"}) {
      try {
        db.query("rms_norm", impl, "bf16", {{"tokens", tok}, {"hidden", 4096}});
      } catch (const Error&) {
      }
    }
  }
  leave_one_out(db);
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(fs::last_write_time(path), mtime);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "sysA"), fs::directory_iterator()), 1);
}

// ---- 2-axis grids ------------------------------------------------------------------------------

namespace {
// t = 2 * batch^0.9 * context^0.6 over batch {1,2,4,8}, context {512,1024,2048,4096}.
OpTable decode_table(const std::string& system) {
  OpTable t;
  t.header = header(system, "attention_decode", {"batch", "context"});
  t.dim_names = {"batch", "context", "q_heads", "kv_heads", "head_dim"};
  for (int64_t b : {1, 2, 4, 8})
    for (int64_t c : {512, 1024, 2048, 4096})
      t.rows.push_back(row("cpu", "bf16", {{"batch", b}, {"context", c}, {"q_heads", 32}, {"kv_heads", 8}, {"head_dim", 128}},
                           2 * std::pow(double(b), 0.9) * std::pow(double(c), 0.6), 1000.0 * b * c, 0));
  return t;
}
Dims decode_at(int64_t b, int64_t c) { return {{"batch", b}, {"context", c}, {"q_heads", 32}, {"kv_heads", 8}, {"head_dim", 128}}; }
}  // namespace

TEST(PerfdbQuery2D, BilinearInLogsIsExactOnSeparablePowerLaws) {
  TempDir dir;
  write_table(decode_table("sysA"), dir / "sysA/attention_decode.csv");
  Database db = Database::load("sysA", dir.str());
  db.set_cost_model([](const std::string&, const std::string&, const Dims& d) {
    Cost c;
    c.bytes = 1000.0 * double(d.at("batch")) * double(d.at("context"));
    return c;
  });
  Answer a = db.query("attention_decode", "auto", "bf16", decode_at(3, 1500));
  EXPECT_EQ(a.method, Method::interpolated);
  EXPECT_EQ(a.how, "interpolated in batch between 2 and 4 and context between 1024 and 2048 (fixed cost plus power "
                   "law; along context on each line of batch, then along batch)");
  EXPECT_NEAR(a.us / (2 * std::pow(3.0, 0.9) * std::pow(1500.0, 0.6)), 1.0, 1e-12);
  db.set_interpolation(Interpolation::log_linear);  // the plain rule: the four corners, bilinear in the logs
  Answer corners = db.query("attention_decode", "auto", "bf16", decode_at(3, 1500));
  EXPECT_EQ(corners.how, "bilinear in batch between 2 and 4 and context between 1024 and 2048");
  EXPECT_NEAR(corners.us / a.us, 1.0, 1e-12);
  db.set_interpolation(Interpolation::floor_power);
  Answer one = db.query("attention_decode", "cpu", "bf16", decode_at(4, 1500));
  EXPECT_EQ(one.how, "interpolated in context between 1024 and 2048 (fixed cost plus power law)");
  EXPECT_NEAR(one.us / (2 * std::pow(4.0, 0.9) * std::pow(1500.0, 0.6)), 1.0, 1e-12);
  // interpolated in one axis, extrapolated in the other
  Answer mix = db.query("attention_decode", "cpu", "bf16", decode_at(16, 1500));
  EXPECT_EQ(mix.method, Method::extrapolated);
  EXPECT_NE(mix.how.find("interpolated in context between 1024 and 2048 (fixed cost plus power law), extrapolated in "
                         "batch from 8 (2.0x beyond)"),
            std::string::npos) << mix.how;
  EXPECT_NEAR(mix.us / (2 * std::pow(8.0, 0.9) * std::pow(1500.0, 0.6) * 2.0), 1.0, 1e-12);
  // non-axis dims: another shape within 4x is scaled by the roofline times (the same bytes in
  // this cost model); 8x away is not available
  Dims other = decode_at(2, 1024);
  other["head_dim"] = 64;
  Answer scaled = db.query("attention_decode", "cpu", "bf16", other);
  EXPECT_EQ(scaled.method, Method::extrapolated);
  EXPECT_NEAR(scaled.us, db.query("attention_decode", "cpu", "bf16", decode_at(2, 1024)).us, 1e-12);
  EXPECT_NE(scaled.how.find("shape scaled from head_dim=128 to head_dim=64"), std::string::npos) << scaled.how;
  other["head_dim"] = 16;
  EXPECT_NE(unavailable([&] { db.query("attention_decode", "cpu", "bf16", other); }).find("head_dim=16"), std::string::npos);
}

TEST(PerfdbQuery2D, BothAxesInsideAreExactOnAFixedCostPlusAProduct) {
  // decode-like: a launch cost plus batch x context of reads, t = 3 + 0.002 * b * c; the one-axis
  // rule along context on each batch line, then along batch, is exact; the corners' bilinear
  // interpolation of the logs is not (Note [two axes by lines])
  TempDir dir;
  OpTable t = decode_table("sysA");
  for (Row& r : t.rows) r.median_us = 3 + 0.002 * double(r.dims.at("batch")) * double(r.dims.at("context"));
  write_table(t, dir / "sysA/attention_decode.csv");
  Database db = Database::load("sysA", dir.str());
  Database plain = Database::load("sysA", dir.str());
  plain.set_interpolation(Interpolation::log_linear);
  for (int64_t b : {3, 5, 7})
    for (int64_t c : {600, 1500, 3000}) {
      const double want = 3 + 0.002 * double(b) * double(c);
      Answer a = db.query("attention_decode", "cpu", "bf16", decode_at(b, c));
      EXPECT_EQ(a.method, Method::interpolated);
      EXPECT_NEAR(a.us / want, 1.0, 1e-9) << b << " " << c << " " << a.how;
      EXPECT_GT(std::abs(plain.query("attention_decode", "cpu", "bf16", decode_at(b, c)).us / want - 1), 1e-4);
    }
}

TEST(PerfdbValidate, BothAxesLeftOutTogether) {
  // batch 1, 2, 4, 8 x context 512 .. 4096: the rows inside both axes are batch 2, 4 x context 1024,
  // 2048 (4 rows), each predicted with its batch and its context left out
  TempDir dir;
  OpTable t = decode_table("sysA");
  write_table(t, dir / "sysA/attention_decode.csv");
  Database power = Database::load("sysA", dir.str());
  ValidationRow p = leave_one_out(power)[0];
  EXPECT_EQ(p.both_axes.points, 4);
  EXPECT_EQ(p.both_axes_plain.points, 4);
  EXPECT_LT(p.both_axes.max_rel_err, 1e-9);  // a separable power law: exact both ways
  EXPECT_LT(p.both_axes_plain.max_rel_err, 1e-9);
  for (Row& r : t.rows) r.median_us = 3 + 0.002 * double(r.dims.at("batch")) * double(r.dims.at("context"));
  TempDir dir2;
  write_table(t, dir2 / "sysA/attention_decode.csv");
  ValidationRow f = leave_one_out(Database::load("sysA", dir2.str()))[0];
  EXPECT_EQ(f.both_axes.points, 4);
  EXPECT_LT(f.both_axes.max_rel_err, 1e-9);  // a fixed cost plus batch x context: exact by lines only
  EXPECT_GT(f.both_axes_plain.max_rel_err, 1e-3);
  EXPECT_EQ(f.both_axes.worst.find("cpu bf16 batch="), 0u) << f.both_axes.worst;
}

TEST(PerfdbQuery2D, MissingCornerIsNotAvailable) {
  TempDir dir;
  OpTable t = decode_table("sysA");
  std::erase_if(t.rows, [](const Row& r) { return r.dims.at("batch") == 4 && r.dims.at("context") == 2048; });
  write_table(t, dir / "sysA/attention_decode.csv");
  Database db = Database::load("sysA", dir.str());
  std::string msg = unavailable([&] { db.query("attention_decode", "cpu", "bf16", decode_at(3, 1500)); });
  EXPECT_NE(msg.find("batch=4, context=2048"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  // the other cells still answer
  EXPECT_EQ(db.query("attention_decode", "cpu", "bf16", decode_at(3, 700)).method, Method::interpolated);
}

TEST(PerfdbQuery2D, NonRectangularGridsAnswerAlongAStoredValue) {
  // batch 8 stops at context 1024 (as a grid capped by memory would): at batch=8 the context axis
  // is bracketed among batch 8's rows only
  TempDir dir;
  OpTable t = decode_table("sysA");
  std::erase_if(t.rows, [](const Row& r) { return r.dims.at("batch") == 8 && r.dims.at("context") > 1024; });
  write_table(t, dir / "sysA/attention_decode.csv");
  Database db = Database::load("sysA", dir.str());
  db.set_cost_model([](const std::string&, const std::string&, const Dims& d) {
    Cost c;
    c.bytes = 1000.0 * double(d.at("batch")) * double(d.at("context"));
    return c;
  });
  Answer a = db.query("attention_decode", "cpu", "bf16", decode_at(8, 2048));
  EXPECT_EQ(a.method, Method::extrapolated);
  EXPECT_NE(a.how.find("extrapolated in context from 1024 (2.0x beyond)"), std::string::npos) << a.how;
  EXPECT_NEAR(a.us, 2 * std::pow(8.0, 0.9) * std::pow(1024.0, 0.6) * 2, 1e-9);
  Answer b = db.query("attention_decode", "cpu", "bf16", decode_at(8, 700));
  // two stored points on that line: the straight line in log-log
  EXPECT_EQ(b.how, "interpolated in context between 512 and 1024 (linear in log-log)");
}

// Note [shapes off the grid]: of the stored shapes within 4x, the one nearest in roofline time
// scales, not the one first in dims. 16 / 8 heads x 256 is as near in dims to 16 / 4 x 128 as
// to 32 / 8 x 128, but the first is 4x the KV bytes away and the second 2x.
TEST(PerfdbQueryShapes, ScaledFromTheShapeNearestInRooflineTime) {
  TempDir dir;
  OpTable t = decode_table("sysH");
  std::vector<Row> narrow;
  for (const Row& r : t.rows) {
    Row n = r;
    n.dims["q_heads"] = 16;
    n.dims["kv_heads"] = 4;
    n.median_us = 0.7 * r.median_us;
    narrow.push_back(n);
  }
  t.rows.insert(t.rows.end(), narrow.begin(), narrow.end());
  write_table(t, dir / "sysH/attention_decode.csv");
  Database db = Database::load("sysH", dir.str());
  auto kv_bytes = [](const std::string&, const std::string&, const Dims& d) {
    Cost c;  // the KV cache read once
    c.bytes = 4.0 * double(d.at("batch") * d.at("context") * d.at("kv_heads") * d.at("head_dim"));
    return c;
  };
  db.set_cost_model(kv_bytes);
  Dims q = decode_at(4, 1024);
  q["q_heads"] = 16;
  q["head_dim"] = 256;
  Answer a = db.query("attention_decode", "cpu", "bf16", q);
  EXPECT_EQ(a.method, Method::extrapolated);
  EXPECT_NE(a.how.find("shape scaled from q_heads=32, head_dim=128 to q_heads=16, head_dim=256 by the roofline "
                       "time (2.000x"),
            std::string::npos)
      << a.how;
  EXPECT_NEAR(a.us, 2 * std::pow(4.0, 0.9) * std::pow(1024.0, 0.6) * 2.0, 1e-9);
  // with the wide shape gone, the narrow one scales (4x the bytes)
  std::erase_if(t.rows, [](const Row& r) { return r.dims.at("q_heads") == 32; });
  write_table(t, dir / "sysH/attention_decode.csv");
  Database only_narrow = Database::load("sysH", dir.str());
  only_narrow.set_cost_model(kv_bytes);
  Answer b = only_narrow.query("attention_decode", "cpu", "bf16", q);
  EXPECT_NEAR(b.us, 0.7 * 2 * std::pow(4.0, 0.9) * std::pow(1024.0, 0.6) * 4.0, 1e-9);
}

// ---- leave-one-out -----------------------------------------------------------------------------

TEST(PerfdbValidate, LeaveOneOutIsZeroOnPowerLaws) {
  TempDir dir;
  write_table(power_law_table("sysA"), dir / "sysA/rms_norm.csv");
  write_table(decode_table("sysA"), dir / "sysA/attention_decode.csv");
  Database db = Database::load("sysA", dir.str());
  std::vector<ValidationRow> v = leave_one_out(db);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].op, "attention_decode");
  EXPECT_EQ(v[0].points, 2 * 4 * 2);  // per axis: 4 lines x 2 interior points
  EXPECT_EQ(v[1].op, "rms_norm");
  EXPECT_EQ(v[1].points, 2 * 9);  // 2 hiddens x 9 interior tokens
  for (const ValidationRow& r : v) {
    EXPECT_LT(r.median_rel_err, 1e-12) << r.op;
    EXPECT_LT(r.p90_rel_err, 1e-12) << r.op;
  }
}

TEST(PerfdbValidate, LeaveOneOutSeesAnOutlier) {
  TempDir dir;
  OpTable t = power_law_table("sysA");
  t.rows[5].median_us *= 1.5;  // hidden 4096, tokens 32
  write_table(t, dir / "sysA/rms_norm.csv");
  Database db = Database::load("sysA", dir.str());
  db.set_interpolation(Interpolation::log_linear);  // the numbers below are the two-point rule's
  std::vector<ValidationRow> v = leave_one_out(db);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].points, 18);
  // the outlier is 1/3 off its prediction; its neighbours (midpoints in log tokens, predicted
  // through it) are sqrt(1.5) - 1 off; the other 15 are exact, so p90 = the 16th of 18 sorted
  EXPECT_LT(v[0].median_rel_err, 1e-12);
  EXPECT_NEAR(v[0].p90_rel_err, std::sqrt(1.5) - 1, 1e-9);
  EXPECT_NEAR(v[0].max_rel_err, 1.0 / 3.0, 1e-9);
  EXPECT_EQ(v[0].worst, "cpu bf16 tokens=32, hidden=4096 along tokens");
  EXPECT_NEAR(v[0].log_linear.p90_rel_err, v[0].p90_rel_err, 1e-15);  // the same rule, the same numbers
  // the monotone cubic predicts the outlier as far off and, through the neighbours' slopes, spreads
  // it to the points two away; the other line stays exact
  db.set_interpolation(Interpolation::monotone_cubic);
  std::vector<ValidationRow> c = leave_one_out(db);
  EXPECT_EQ(c[0].points, 18);
  EXPECT_LT(c[0].median_rel_err, 1e-12);
  EXPECT_GT(c[0].max_rel_err, 1.0 / 3.0 - 1e-9);
  EXPECT_NEAR(c[0].log_linear.max_rel_err, 1.0 / 3.0, 1e-9);
}
