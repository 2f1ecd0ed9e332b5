// Registry, policy grammar and precedence, slots, explain, boxed calls.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "opforge/error.h"
#include "tests/toy_ops.h"

namespace {

using namespace opforge;

Availability never() { return {false, "needs hardware this machine lacks"}; }

struct Fixture : ::testing::Test {
  Registry reg;
  Tensor x = Tensor::empty(Shape{2, 3}, DType::f32);
  Tensor y = Tensor::empty(Shape{2, 3}, DType::f32);
  void SetUp() override {
    toy::add_scale2(reg, "fast", &toy::scale2_good, &toy::even_only, 200);
    toy::add_scale2(reg, "plain", &toy::scale2_good, nullptr, 100);
    KernelDesc gpu_only{"exotic", DeviceKind::cpu, 300};
    gpu_only.probe = never;
    reg.add_kernel<toy::Scale2>(gpu_only, &toy::scale2_good);
    for (int i = 0; i < 6; ++i) x.ptr<float>()[i] = float(i + 1);
  }
  std::vector<std::string> impls(const Decision& d) {
    std::vector<std::string> v;
    for (const Candidate& c : d.candidates) v.push_back(c.kernel->impl());
    return v;
  }
  Decision decide(const std::string& spec) { return reg.decide(reg.op("scale2"), Policy::parse(spec, "test"), Device::cpu()); }
};

TEST(Policy, ParsesEveryItemKind) {
  Policy p = Policy::parse("all, -a +b c=x|y strict fallback none", "api");
  ASSERT_EQ(p.rules().size(), 7u);
  EXPECT_EQ(p.rules()[1].kind, PolicyRule::Kind::disable_op);
  EXPECT_EQ(p.rules()[3].kind, PolicyRule::Kind::force);
  EXPECT_EQ(p.rules()[3].impls, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(p.rules()[0].source, "api");
}

TEST(Policy, RejectsMalformedItems) {
  for (const char* bad : {"+", "-", "op=", "=cpu", "op=a||b", "op=a|", "allx", "+a-b!", "a=b=c"})
    EXPECT_THROW(Policy::parse(bad, "t"), Error) << bad;
  try {
    Policy::parse("-rms_norm, bogus", "OPFORGE_OPS");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bogus' (from OPFORGE_OPS)"), std::string::npos) << e.what();
  }
}

TEST_F(Fixture, UnknownNamesListTheValidOnes) {
  try {
    Policy::parse("-scale3").validate(reg);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unknown_name);
    EXPECT_NE(std::string(e.what()).find("valid ops: scale2"), std::string::npos) << e.what();
  }
  try {
    Policy::parse("scale2=fsat").validate(reg);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid impls: reference, fast, plain, exotic"), std::string::npos) << e.what();
  }
}

TEST_F(Fixture, RanksByPriorityAndSkipsUnavailable) {
  Decision d = decide("");
  EXPECT_EQ(impls(d), (std::vector<std::string>{"fast", "plain", "reference"}));
  EXPECT_NE(d.explain().find("exotic: unavailable: needs hardware this machine lacks"), std::string::npos);
}

TEST_F(Fixture, LaterRulesOverrideEarlierOnes) {
  EXPECT_EQ(impls(decide("none")), (std::vector<std::string>{"reference"}));
  EXPECT_EQ(impls(decide("none,+scale2")), (std::vector<std::string>{"fast", "plain", "reference"}));
  EXPECT_EQ(impls(decide("-scale2")), (std::vector<std::string>{"reference"}));
  EXPECT_EQ(impls(decide("-scale2,all")), (std::vector<std::string>{"fast", "plain", "reference"}));
  EXPECT_EQ(impls(decide("scale2=plain")), (std::vector<std::string>{"plain", "fast", "reference"}));
  EXPECT_EQ(impls(decide("scale2=plain,strict")), (std::vector<std::string>{"plain"}));
  EXPECT_EQ(impls(decide("scale2=reference|plain,strict")), (std::vector<std::string>{"reference", "plain"}));
}

TEST_F(Fixture, StrictRejectsAForcedKernelThatCannotRun) {
  EXPECT_THROW(decide("scale2=exotic,strict"), Error);
  Decision d = decide("scale2=exotic");  // fallback: next candidates, with the reason in the trace
  EXPECT_EQ(impls(d).front(), "fast");
  EXPECT_NE(d.explain().find("forced exotic unavailable"), std::string::npos) << d.explain();
}

TEST_F(Fixture, SourcesStackInPrecedenceOrder) {
  std::string path = ::testing::TempDir() + "/opforge_policy.json";
  std::ofstream(path) << R"({"ops": ["none"], "mode": "strict"})";
  ::setenv("OPFORGE_OPS", "+scale2", 1);
  Policy p = Policy::from_sources(path, "scale2=plain", "--ops");
  ::unsetenv("OPFORGE_OPS");
  OpRuling r = p.ruling("scale2");
  EXPECT_EQ(r.forced, (std::vector<std::string>{"plain"}));
  EXPECT_EQ(r.rule->source, "--ops");
  EXPECT_EQ(r.mode, PolicyMode::strict);
  EXPECT_EQ(r.mode_rule->source, "config file " + path);
  EXPECT_FALSE(p.ruling("other").optimized);  // config's "none" still holds for other ops
}

TEST(PolicyJson, RejectsBadConfigs) {
  for (const char* bad : {"[]", "{\"ops\": 3}", "{\"mode\": \"loose\"}", "{\"opz\": \"all\"}", "{", "{\"ops\": [1]}"})
    EXPECT_THROW(Policy::from_json(bad, "t"), Error) << bad;
  EXPECT_EQ(Policy::from_json(R"({"ops": "all,-x"})", "t").rules().size(), 2u);
}

TEST_F(Fixture, SlotRunsTheFirstApplicableCandidateAndExplains) {
  auto slot = bind<toy::Scale2>(reg, Policy::parse("all", "--ops"), Device::cpu());
  std::vector<std::string> warnings;
  set_warning_handler([&](const std::string& m) { warnings.push_back(m); });
  EXPECT_EQ(slot.pick(y, x).impl(), "fast");
  Tensor x_odd = Tensor::empty(Shape{3}, DType::f32), y_odd = Tensor::empty(Shape{3}, DType::f32);
  for (int i = 0; i < 3; ++i) x_odd.ptr<float>()[i] = 1.5f;
  slot(y_odd, x_odd);
  slot(y_odd, x_odd);
  set_warning_handler(nullptr);
  EXPECT_EQ(y_odd.ptr<float>()[2], 3.0f);
  ASSERT_EQ(warnings.size(), 1u);  // once
  EXPECT_NE(warnings[0].find("numel % 2 != 0"), std::string::npos);
  slot(y, x);
  EXPECT_EQ(y.ptr<float>()[5], 12.0f);
  EXPECT_NE(slot.explain().find("rule: 'all' (from --ops)"), std::string::npos) << slot.explain();
}

TEST_F(Fixture, StrictSlotRejectsArgumentsItsForcedKernelCannotTake) {
  auto slot = bind<toy::Scale2>(reg, Policy::parse("scale2=fast,strict"), Device::cpu());
  Tensor x_odd = Tensor::empty(Shape{3}, DType::f32), y_odd = Tensor::empty(Shape{3}, DType::f32);
  try {
    slot(y_odd, x_odd);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fast: numel % 2 != 0"), std::string::npos) << e.what();
  }
}

TEST_F(Fixture, SlotChecksBeforeWriting) {
  auto slot = bind<toy::Scale2>(reg, Policy{}, Device::cpu());
  Tensor wrong = Tensor::zeros(Shape{3, 2}, DType::f32);
  EXPECT_THROW(slot(wrong, x), Error);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(wrong.ptr<float>()[i], 0.0f);
  TensorView on_gpu = x.view();
  on_gpu.device = Device::cuda(0);
  try {
    slot(y, on_gpu);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'x': expected a tensor on cpu"), std::string::npos) << e.what();
  }
}

TEST_F(Fixture, BoxedCallsCheckArityAndTypes) {
  std::vector<Value> two = {y.view(), x.view()};
  EXPECT_EQ(reg.call("scale2", two).impl(), "fast");
  EXPECT_EQ(y.ptr<float>()[0], 2.0f);
  std::vector<Value> one = {y.view()};
  EXPECT_THROW(reg.call("scale2", one), Error);
  std::vector<Value> typed = {y.view(), 3.0};
  try {
    reg.call("scale2", typed);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "scale2: argument 'x': expected tensor, got float");
  }
  EXPECT_THROW(reg.call("nope", two), Error);
}

TEST_F(Fixture, DumpJsonListsKernelsWithSelection) {
  auto doc = nlohmann::json::parse(reg.dump_json(Policy{}));
  const auto& op = doc["ops"][0];
  EXPECT_EQ(op["name"], "scale2");
  EXPECT_EQ(op["signature"], "scale2(out Tensor y, Tensor x)");
  int selected = 0;
  for (const auto& k : op["kernels"]) {
    selected += k["selected"].get<bool>();
    if (k["impl"] == "fast") {
      EXPECT_TRUE(k["selected"].get<bool>());
    }
    if (k["impl"] == "exotic") {
      EXPECT_FALSE(k["available"].get<bool>());
      EXPECT_EQ(k["reason"], "needs hardware this machine lacks");
    }
  }
  EXPECT_EQ(selected, 1);
  EXPECT_EQ(doc["counts"]["cpu"]["optimized"], 1);
}

TEST(Registry, DuplicateKernelsAreRejected) {
  Registry reg;
  toy::add_scale2(reg, "a", &toy::scale2_good);
  EXPECT_THROW(toy::add_scale2(reg, "a", &toy::scale2_good), Error);
}

}  // namespace
