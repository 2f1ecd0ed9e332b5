// Note [kernels that cannot run the shape] (src/perfdb/database.cpp): a query asks each measured
// kernel whether it can run the query's shape before its rows answer.
#include <gtest/gtest.h>

#include <string>

#include "opforge/error.h"
#include "opforge/perfdb.h"
#include "opforge/registry.h"
#include "perfdb_test_util.h"

namespace opforge {
namespace {

using perfdb::Answer;
using perfdb::Database;
using perfdb::Dims;
using perfdb::Method;
using test_util::ScratchFolder;

// rms_norm at hidden 4096 by two kernels: `cpu` and `fast`, which takes half the time.
Database two_kernels(const ScratchFolder& dir) {
  perfdb::OpTable t = test_util::rms_norm_line("sysR", {1, 16, 256, 4096}, [](double x) { return 2.0 + 0.01 * x; });
  const size_t n = t.rows.size();
  for (size_t i = 0; i < n; ++i) {
    perfdb::Row r = t.rows[i];
    r.impl = "fast";
    r.median_us *= 0.5;
    t.rows.push_back(r);
  }
  perfdb::write_table(t, dir.file("sysR/rms_norm.csv"));
  Database db = Database::load("sysR", dir.str());
  db.set_cost_model([](const std::string&, const std::string&, const Dims& d) {
    Cost c;
    c.bytes = 4.0 * double(d.at("tokens") * d.at("hidden"));
    return c;
  });
  return db;
}

// `fast` takes hidden 4096 only; with `both`, `cpu` neither.
perfdb::RefusalFn narrow_kernels(bool both) {
  return [both](const std::string&, const std::string& impl, const std::string&, const Dims& d) -> std::string {
    if (d.at("hidden") == 4096) return "";
    if (impl == "fast" || both) return "hidden is not 4096";
    return "";
  };
}

TEST(PerfdbRefusal, KernelsThatRunTheShapeAnswerFirst) {
  ScratchFolder dir("refusal");
  Database db = two_kernels(dir);
  db.set_refusal_check(narrow_kernels(false));
  const Dims stored{{"tokens", 256}, {"hidden", 4096}}, wide{{"tokens", 256}, {"hidden", 8192}};
  Answer at_stored = db.query("rms_norm", "auto", "bf16", stored);
  EXPECT_EQ(at_stored.impl, "fast");
  EXPECT_EQ(at_stored.method, Method::measured);
  EXPECT_FALSE(at_stored.stand_in_for.has_value());
  // at hidden 8192 `fast`'s rows would scale to the faster answer, but that kernel cannot run it
  Answer at_wide = db.query("rms_norm", "auto", "bf16", wide);
  EXPECT_EQ(at_wide.impl, "cpu");
  EXPECT_NEAR(at_wide.us, 2.0 * (2.0 + 0.01 * 256), 1e-9);  // cpu's time scaled by the roofline (2x the bytes)
  EXPECT_FALSE(at_wide.stand_in_for.has_value());
  // asked for by name, the refusing kernel has no answer, and says why
  try {
    db.query("rms_norm", "fast", "bf16", wide);
    ADD_FAILURE() << "expected PerfDataNotAvailable";
  } catch (const perfdb::PerfDataNotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run the shape (hidden is not 4096)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(db.query("rms_norm", "fast", "bf16", stored).impl, "fast");
}

TEST(PerfdbRefusal, WhenEveryKernelRefusesTheFastestStandsInAndSaysSo) {
  ScratchFolder dir("refusal");
  Database db = two_kernels(dir);
  db.set_refusal_check(narrow_kernels(true));
  Answer a = db.query("rms_norm", "auto", "bf16", {{"tokens", 256}, {"hidden", 8192}});
  // neither test kernel is in the registry, so no kernel that would run it can be named
  EXPECT_EQ(a.impl, "fast (cannot run this shape)");
  ASSERT_TRUE(a.stand_in_for.has_value());
  EXPECT_EQ(*a.stand_in_for, "");
  EXPECT_EQ(a.method, Method::extrapolated);
  EXPECT_NE(a.how.find("fast cannot run this shape (hidden is not 4096): its rows stand in for"), std::string::npos)
      << a.how;
  EXPECT_NEAR(a.us, 0.5 * 2.0 * (2.0 + 0.01 * 256), 1e-9);
}

// The default check asks the registered kernel's own predicate on shape-only views.
TEST(PerfdbRefusal, DefaultCheckAsksTheKernelsPredicate) {
  const Dims gemma{{"batch", 8}, {"context", 2048}, {"q_heads", 16}, {"kv_heads", 8}, {"head_dim", 256}};
  const Dims llama{{"batch", 8}, {"context", 2048}, {"q_heads", 32}, {"kv_heads", 8}, {"head_dim", 128}};
  EXPECT_EQ(perfdb::kernel_refusal("no_such_op", "cpu", "bf16", gemma), "");
  EXPECT_EQ(perfdb::kernel_refusal("attention_decode", "no_such_impl", "bf16", gemma), "");
  const OpEntry& e = global_registry().op("attention_decode");
  const KernelEntry* mma = nullptr;
  for (const KernelEntry& k : e.kernels)
    if (k.impl() == "cuda_split_mma") mma = &k;
  if (mma && mma->fn) {  // a build with the CUDA kernels (no device needed: the predicate reads shapes)
    EXPECT_EQ(perfdb::kernel_refusal("attention_decode", "cuda_split_mma", "bf16", gemma), "head_dim is not 64 or 128");
    EXPECT_EQ(perfdb::kernel_refusal("attention_decode", "cuda_split_mma", "bf16", llama), "");
    const std::string runs = perfdb::kernel_that_runs("attention_decode", "cuda_split_mma", "bf16", gemma);
    EXPECT_EQ(runs, "cuda_split_async");  // the next by priority, which takes head_dim 256
    EXPECT_EQ(perfdb::kernel_that_runs("attention_decode", "cuda_split_mma", "bf16", llama), "cuda_split_mma");
  } else {  // cannot tell: answers as if the kernel took the shape
    EXPECT_EQ(perfdb::kernel_refusal("attention_decode", "cuda_split_mma", "bf16", gemma), "");
    EXPECT_EQ(perfdb::kernel_that_runs("attention_decode", "cuda_split_mma", "bf16", gemma), "");
  }
  // the CPU kernel is in every build and takes both shapes
  EXPECT_EQ(perfdb::kernel_refusal("attention_decode", "cpu", "bf16", gemma), "");
  EXPECT_EQ(perfdb::kernel_that_runs("attention_decode", "cpu", "bf16", gemma), "cpu");
}

}  // namespace
}  // namespace opforge
