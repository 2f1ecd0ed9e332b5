// Model configs, the decoder layer as op calls, the estimator against a synthetic perf database
// written to a temporary folder, support, and run-layer on a tiny config.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/estimate.h"
#include "model/model.h"
#include "model/run_layer.h"
#include "opforge/error.h"
#include "opforge/perfdb.h"

namespace fs = std::filesystem;
using namespace opforge;
using namespace opforge::model;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

template <class E = Error, class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

const char* kTiny = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
  "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2, "vocab_size": 100})";
const char* kTinyMoe = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 2,
  "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 100})";

const std::map<std::string, std::vector<std::string>>& dim_order() {
  static const std::map<std::string, std::vector<std::string>> order = {
      {"rms_norm", {"tokens", "hidden"}},
      {"fused_add_rms_norm", {"tokens", "hidden"}},
      {"gemma_rms_norm", {"tokens", "hidden"}},
      {"gemma_fused_add_rms_norm", {"tokens", "hidden"}},
      {"silu_and_mul", {"tokens", "d"}},
      {"gelu_and_mul", {"tokens", "d"}},
      {"rotary_embedding", {"tokens", "q_heads", "kv_heads", "head_size"}},
      {"linear", {"tokens", "n", "k"}},
      {"attention_prefill", {"batch", "tokens", "q_heads", "kv_heads", "head_dim"}},
      {"attention_decode", {"batch", "context", "q_heads", "kv_heads", "head_dim"}},
      {"topk_softmax", {"tokens", "experts", "k"}},
      {"moe_permute", {"tokens", "hidden", "experts", "k"}},
      {"moe_unpermute", {"tokens", "hidden", "experts", "k"}},
      {"embedding", {"tokens", "vocab", "hidden"}},
      {"all_reduce", {"message_bytes", "tp"}},
  };
  return order;
}

// A database holding exactly the points a model's calls query, each at a time derived from its
// dims, written in the documented CSV format (perfdb.h).
struct SyntheticDb {
  fs::path root;
  std::string system = "synthetic-cpu";
  double ceiling_gbps = 20.0;
  std::map<std::string, std::map<perfdb::Dims, double>> points;  // op -> dims -> us

  SyntheticDb() {
    root = fs::temp_directory_path() / ("opforge_estimator_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter()++));
    fs::create_directories(root / system);
  }
  ~SyntheticDb() { fs::remove_all(root); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  static double us_of(const perfdb::Dims& d) {
    double s = 1.0;
    for (const auto& [k, v] : d) s += std::fmod(double(v) * 0.37 + double(k.size()), 17.0);
    return s;
  }
  static perfdb::Dims at_rows(perfdb::Dims d, int64_t rows) {
    d["tokens"] = rows;
    return d;
  }
  void add(const std::vector<OpCall>& calls) {
    for (const OpCall& c : calls) {
      if (c.modelled_bytes != 0) continue;
      points[c.op][c.dims] = us_of(c.dims);
      for (const RowsShare& s : c.spread) points[c.op][at_rows(c.dims, s.rows)] = us_of(at_rows(c.dims, s.rows));
    }
  }
  // Note [moe row spread]: a call with a spread costs sum(experts x time at rows).
  double call_us(const OpCall& c) const {
    if (c.modelled_bytes > 0) return double(c.count) * c.modelled_bytes / (ceiling_gbps * 1e3);
    if (c.spread.empty()) return double(c.count) * c.layer_share * c.work_scale * points.at(c.op).at(c.dims);
    double s = 0;
    for (const RowsShare& x : c.spread) s += x.experts * points.at(c.op).at(at_rows(c.dims, x.rows));
    return s;
  }
  void write(const std::set<std::string>& skip = {}) const {
    for (const auto& [op, rows] : points) {
      if (skip.count(op)) continue;
      std::ofstream f(root / system / (op + ".csv"));
      const std::vector<std::string>& dims = dim_order().at(op);
      f << "# opforge-perfdb 1\n# system: " << system << "\n# op: " << op
        << "\n# device: test\n# commit: unknown\n# date: 2026-11-26\n# ceiling_gbps: " << ceiling_gbps
        << "\n# ceiling_gflops: 100\n# axes: " << dims[0] << "\nimpl,dtype";
      for (const std::string& d : dims) f << "," << d;
      f << ",median_us,bytes,flops,energy_uj\n";
      for (const auto& [d, us] : rows) {
        f << "cpu,bf16";
        for (const std::string& n : dims) f << "," << d.at(n);
        f << "," << us << ",1000,1000,\n";
        f << "reference,bf16";  // slower impl: "auto" must pick cpu
        for (const std::string& n : dims) f << "," << d.at(n);
        f << "," << us * 10 << ",1000,1000,\n";
      }
    }
  }
  perfdb::Database load() const { return perfdb::Database::load(system, root.string()); }
  double expected(const std::vector<OpCall>& calls) const {
    double s = 0;
    for (const OpCall& c : calls) s += call_us(c);
    return s;
  }
};

std::vector<std::string> names(const std::vector<OpCall>& calls) {
  std::vector<std::string> n;
  for (const OpCall& c : calls) n.push_back(c.name);
  return n;
}

const OpCall& find(const std::vector<OpCall>& calls, const std::string& name) {
  for (const OpCall& c : calls)
    if (c.name == name) return c;
  throw std::runtime_error("no call " + name);
}

}  // namespace

TEST(ModelConfig, ShippedModelsHaveTheirPublicDims) {
  ModelSpec l8 = load_model("llama-3.1-8b");
  EXPECT_EQ(l8.family, Family::llama);
  EXPECT_EQ(l8.hidden, 4096);
  EXPECT_EQ(l8.intermediate, 14336);
  EXPECT_EQ(l8.heads, 32);
  EXPECT_EQ(l8.kv_heads, 8);
  EXPECT_EQ(l8.head_dim, 128);
  EXPECT_EQ(l8.layers, 32);
  EXPECT_EQ(l8.vocab, 128256);
  EXPECT_DOUBLE_EQ(l8.rms_norm_eps, 1e-5);
  EXPECT_EQ(load_model("Llama-3.1-8B").hidden, 4096);  // the Hugging Face spelling names the same file
  ModelSpec l70 = load_model("llama-3.1-70b");
  EXPECT_EQ(l70.hidden, 8192);
  EXPECT_EQ(l70.intermediate, 28672);
  EXPECT_EQ(l70.heads, 64);
  EXPECT_EQ(l70.kv_heads, 8);
  EXPECT_EQ(l70.layers, 80);
  ModelSpec q8 = load_model("qwen3-8b");
  EXPECT_EQ(q8.family, Family::qwen3);
  EXPECT_TRUE(q8.has_qk_norm());
  EXPECT_EQ(q8.intermediate, 12288);
  EXPECT_EQ(q8.layers, 36);
  EXPECT_EQ(q8.vocab, 151936);
  ModelSpec q30 = load_model("qwen3-30b-a3b");
  EXPECT_EQ(q30.family, Family::qwen3_moe);
  EXPECT_EQ(q30.hidden, 2048);
  EXPECT_EQ(q30.heads, 32);
  EXPECT_EQ(q30.kv_heads, 4);
  EXPECT_EQ(q30.head_dim, 128);  // not hidden / heads = 64
  EXPECT_EQ(q30.layers, 48);
  EXPECT_EQ(q30.experts, 128);
  EXPECT_EQ(q30.experts_per_token, 8);
  EXPECT_EQ(q30.moe_intermediate, 768);
  EXPECT_TRUE(q30.norm_topk_prob);
  ModelSpec mx = load_model("mixtral-8x7b");
  EXPECT_EQ(mx.family, Family::mixtral);
  EXPECT_EQ(mx.experts, 8);
  EXPECT_EQ(mx.experts_per_token, 2);
  EXPECT_EQ(mx.moe_intermediate, 14336);
  EXPECT_EQ(mx.vocab, 32000);
  // written from the public configs of models whose dims the collector's grid does not hold
  ModelSpec q2 = load_model("qwen2-7b");
  EXPECT_EQ(q2.family, Family::qwen2);
  EXPECT_EQ(q2.hidden, 3584);
  EXPECT_EQ(q2.head_dim, 128);
  EXPECT_EQ(q2.kv_heads, 4);
  EXPECT_EQ(q2.sliding_window, 0);  // use_sliding_window false
  ModelSpec g2 = load_model("gemma-2-9b");
  EXPECT_EQ(g2.family, Family::gemma2);
  EXPECT_EQ(g2.head_dim, 256);
  EXPECT_EQ(g2.layers, 42);
  EXPECT_EQ(g2.sliding_window, 4096);
  ModelSpec m3 = load_model("mistral-7b-v0.3");
  EXPECT_EQ(m3.family, Family::mistral);
  EXPECT_EQ(m3.vocab, 32768);
  EXPECT_EQ(m3.sliding_window, 0);  // null
  EXPECT_EQ(shipped_models().size(), 8u);
}

TEST(ModelConfig, GemmaTextConfigIsNested) {
  ModelSpec g = parse_model_config(R"({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
    "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "num_hidden_layers": 34, "vocab_size": 262208}})", "gemma3.json");
  EXPECT_EQ(g.family, Family::gemma3);
  EXPECT_EQ(g.hidden, 2560);
  EXPECT_EQ(g.head_dim, 256);
  std::vector<OpCall> layer = decoder_layer(g, Workload::prefill(1, 16));
  EXPECT_EQ(find(layer, "input_norm").op, "gemma_fused_add_rms_norm");
  EXPECT_EQ(find(layer, "q_norm").op, "gemma_rms_norm");
  EXPECT_EQ(find(layer, "act").op, "gelu_and_mul");
  EXPECT_EQ(find(layer, "post_ffn_norm").op, "gemma_rms_norm");
}

// Note [sliding-window layers]: which layers attend to a window, per family and by layer_types.
TEST(ModelConfig, SlidingWindowLayers) {
  const std::string dims = R"("hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100)";
  auto parse = [&](const std::string& arch, const std::string& extra) {
    return parse_model_config(R"({"architectures": [")" + arch + R"("], )" + dims + ", " + extra + "}", arch + ".json");
  };
  ModelSpec g2 = parse("Gemma2ForCausalLM", R"("num_hidden_layers": 42)");
  EXPECT_EQ(g2.sliding_window, 4096);
  EXPECT_EQ(g2.window_layers, 21);
  ModelSpec g3 = parse("Gemma3ForCausalLM", R"("num_hidden_layers": 48, "sliding_window": 1024)");
  EXPECT_EQ(g3.sliding_window, 1024);
  EXPECT_EQ(g3.window_layers, 40);
  ModelSpec typed = parse("Gemma3ForCausalLM", R"("num_hidden_layers": 3, "sliding_window": 512,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"])");
  EXPECT_EQ(typed.window_layers, 2);
  EXPECT_EQ(parse("MistralForCausalLM", R"("num_hidden_layers": 32, "sliding_window": 4096)").window_layers, 32);
  EXPECT_EQ(parse("MistralForCausalLM", R"("num_hidden_layers": 32, "sliding_window": null)").window_layers, 0);
  EXPECT_EQ(parse("Qwen2ForCausalLM", R"("num_hidden_layers": 28, "sliding_window": 4096, "max_window_layers": 20,
    "use_sliding_window": true)").window_layers, 8);
  EXPECT_EQ(parse("Qwen2ForCausalLM", R"("num_hidden_layers": 28, "sliding_window": 4096, "max_window_layers": 20,
    "use_sliding_window": false)").window_layers, 0);
  EXPECT_EQ(parse("LlamaForCausalLM", R"("num_hidden_layers": 4, "sliding_window": 4096)").window_layers, 0);
  EXPECT_THAT(error_of([&] { parse("Gemma3ForCausalLM", R"("num_hidden_layers": 2, "sliding_window": 512,
    "layer_types": ["sliding_attention", "linear_attention"])"); }), HasSubstr("layer_types"));
  EXPECT_THAT(error_of([&] { parse("Gemma3ForCausalLM", R"("num_hidden_layers": 3, "layer_types": ["full_attention"])"); }),
              HasSubstr("3 layer types"));
}

TEST(DecoderLayer, SlidingWindowAttentionIsTheMeanLayer) {
  ModelSpec m = parse_model_config(R"({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    "num_hidden_layers": 6, "vocab_size": 100, "sliding_window": 8})", "g.json");
  ASSERT_EQ(m.window_layers, 5);
  std::vector<OpCall> pre = decoder_layer(m, Workload::prefill(2, 32));
  const OpCall& full = find(pre, "attention");
  const OpCall& local = find(pre, "attention_local");
  EXPECT_DOUBLE_EQ(full.layer_share, 1.0 / 6);
  EXPECT_DOUBLE_EQ(local.layer_share, 5.0 / 6);
  EXPECT_EQ(full.work_scale, 1.0);
  // per sequence 8 * 9 / 2 + 24 * 8 query-key products against the causal 32 * 33 / 2
  EXPECT_DOUBLE_EQ(local.work_scale, (36.0 + 192.0) / 528.0);
  EXPECT_EQ(local.dims.at("tokens"), 32);
  std::vector<OpCall> dec = decoder_layer(m, Workload::decode(4, 100));
  EXPECT_EQ(find(dec, "attention").dims.at("context"), 100);
  EXPECT_EQ(find(dec, "attention_local").dims.at("context"), 8);
  EXPECT_EQ(find(dec, "attention_local").work_scale, 1.0);
  // run-layer's layer: every layer's attention over the whole context
  std::vector<OpCall> whole = decoder_layer(m, Workload::decode(4, 100), /*windows=*/false);
  EXPECT_EQ(std::count_if(whole.begin(), whole.end(), [](const OpCall& c) { return c.name == "attention_local"; }), 0);
  EXPECT_EQ(find(whole, "attention").layer_share, 1.0);
  // the estimate sums each call times its share of the layers and its work scale
  for (const Workload& w : {Workload::prefill(2, 32), Workload::decode(4, 100)}) {
    SyntheticDb db;
    db.add(decoder_layer(m, w));
    db.write();
    const std::vector<OpCall> calls = decoder_layer(m, w);
    const std::vector<EstimateRow> rows = estimate_calls(db.load(), calls, "auto", "bf16", {});
    double total = 0;
    for (const EstimateRow& r : rows) total += r.total_us;
    EXPECT_NEAR(total, db.expected(calls), 1e-9 * total);
    const EstimateRow& r = *std::find_if(rows.begin(), rows.end(), [](const EstimateRow& x) { return x.call.name == "attention_local"; });
    if (w.phase == Phase::prefill) EXPECT_THAT(r.answer.how, HasSubstr("sliding window"));
  }
}

// Note [missing fields]: the published Gemma 3 multimodal files leave heads, head_dim and vocab to
// Gemma3TextConfig's defaults; Gemma 2 and Qwen3 have a head_dim default that is not hidden / heads.
TEST(ModelConfig, MissingFieldsTakeTheFamilyDefaults) {
  const std::string gemma3 = R"({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {)";
  ModelSpec g4 = parse_model_config(gemma3 + R"("hidden_size": 2560, "intermediate_size": 10240,
    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}})",
                                    "gemma-3-4b.json");
  EXPECT_EQ(g4.heads, 8);
  EXPECT_EQ(g4.kv_heads, 4);
  EXPECT_EQ(g4.head_dim, 256);
  EXPECT_EQ(g4.vocab, 262208);
  EXPECT_EQ(g4.window_layers, 29);
  EXPECT_EQ(g4.defaulted, (std::vector<std::string>{"num_attention_heads 8", "num_key_value_heads 4", "head_dim 256",
                                                    "vocab_size 262208"}));
  ModelSpec g12 = parse_model_config(gemma3 + R"("hidden_size": 3840, "intermediate_size": 15360,
    "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 48, "sliding_window": 1024}})", "g12.json");
  EXPECT_EQ(g12.head_dim, 256);  // not 3840 / 16
  EXPECT_EQ(find(decoder_layer(g12, Workload::prefill(1, 16, 2)), "qkv_proj").dims,
            (perfdb::Dims{{"tokens", 16}, {"n", (8 + 2 * 4) * 256}, {"k", 3840}}));
  // a layer_types list without the window: Gemma's default window
  ModelSpec typed = parse_model_config(gemma3 + R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"]}})", "typed.json");
  EXPECT_EQ(typed.sliding_window, 4096);
  EXPECT_EQ(typed.window_layers, 1);
  const std::string dims = R"("hidden_size": 2560, "intermediate_size": 9728, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 1000})";
  auto parse = [&](const char* arch) { return parse_model_config(R"({"architectures": [")" + std::string(arch) + R"("], )" + dims, "x.json"); };
  EXPECT_EQ(parse("Qwen3ForCausalLM").head_dim, 128);  // Qwen3-4B: not 2560 / 32
  EXPECT_EQ(parse("Gemma2ForCausalLM").head_dim, 256);
  EXPECT_EQ(parse("LlamaForCausalLM").head_dim, 80);
  EXPECT_TRUE(parse("LlamaForCausalLM").defaulted.empty());
  // Qwen3MoeConfig's norm_topk_prob is false unless the file says so
  EXPECT_FALSE(parse_model_config(kTinyMoe, "tiny-moe.json").norm_topk_prob);
}

// Note [size limits]: sizes whose products would wrap int64 are errors naming the fields or flags.
TEST(ModelConfig, HugeSizesAreErrorsNamingThem) {
  auto cfg = [](const std::string& hidden, const std::string& vocab) {
    return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": )" + hidden + R"(, "intermediate_size": 128,
      "num_attention_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": )" + vocab + "}";
  };
  EXPECT_THAT(error_of([&] { parse_model_config(cfg("4611686018427387904", "100"), "h.json"); }),
              AllOf(HasSubstr("hidden_size 4611686018427387904"), HasSubstr("h.json")));
  EXPECT_THAT(error_of([&] { parse_model_config(cfg("64", "4611686018427387904"), "v.json"); }), HasSubstr("vocab_size"));
  EXPECT_THAT(error_of([&] { parse_model_config(cfg("64", "18446744073709551615"), "u.json"); }),
              HasSubstr("vocab_size': past int64, got 18446744073709551615"));
  ModelSpec m = load_model("llama-3.1-8b");
  EXPECT_THAT(error_of([&] { decoder_layer(m, Workload::prefill(int64_t(1) << 40, int64_t(1) << 40)); }),
              HasSubstr("--batch 1099511627776 x --input-len 1099511627776"));
  EstimateOptions o;
  o.output_len = INT64_MAX;
  EXPECT_THAT(error_of([&] { validate_options(m, o); }), HasSubstr("--output-len"));
}

// An MoE model's dense intermediate_size builds no GEMM, so it does not limit the TP degree.
TEST(DecoderLayer, MoeDenseIntermediateDoesNotLimitTp) {
  ModelSpec m = parse_model_config(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
    "intermediate_size": 6, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 100})",
                                   "moe.json");
  EXPECT_EQ(find(decoder_layer(m, Workload::decode(1, 8, 4)), "expert_gate_up").dims.at("n"), 16);
}

TEST(ModelConfig, Qwen3MoeWithDenseLayersIsRefused) {
  const std::string base = R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 100)";
  EXPECT_EQ(parse_model_config(base + R"(, "decoder_sparse_step": 1, "mlp_only_layers": []})", "q.json").experts, 4);
  EXPECT_THAT(error_of([&] { parse_model_config(base + R"(, "mlp_only_layers": [0]})", "q.json"); }),
              HasSubstr("mlp_only_layers"));
  EXPECT_THAT(error_of([&] { parse_model_config(base + R"(, "decoder_sparse_step": 2})", "q.json"); }),
              HasSubstr("decoder_sparse_step"));
}

TEST(ModelConfig, UnknownArchitectureListsTheSupportedOnes) {
  std::string msg = error_of([] { parse_model_config(R"({"architectures": ["FalconForCausalLM"]})", "falcon.json"); });
  EXPECT_THAT(msg, HasSubstr("FalconForCausalLM"));
  EXPECT_THAT(msg, HasSubstr("LlamaForCausalLM"));
  EXPECT_THAT(msg, HasSubstr("Qwen3MoeForCausalLM"));
  EXPECT_THAT(msg, HasSubstr("Gemma2ForCausalLM"));
  EXPECT_THAT(error_of([] { load_model("no-such-model"); }), HasSubstr("llama-3.1-8b"));
}

TEST(ModelConfig, MissingOrBadFieldNamesFieldAndFile) {
  std::string msg = error_of([] {
    parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 2})", "cfg/broken.json");
  });
  EXPECT_THAT(msg, HasSubstr("hidden_size"));
  EXPECT_THAT(msg, HasSubstr("cfg/broken.json"));
  EXPECT_THAT(error_of([] {
                parse_model_config(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 64,
                  "intermediate_size": 128, "num_attention_heads": 2, "num_hidden_layers": 1, "vocab_size": 10})",
                                   "m.json");
              }),
              HasSubstr("num_local_experts"));
  EXPECT_THAT(error_of([] {
                parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": -4})", "neg.json");
              }),
              HasSubstr("hidden_size"));
  EXPECT_THAT(error_of([] { parse_model_config("{not json", "x.json"); }), HasSubstr("x.json"));
  // a model folder: its config.json, named after the folder
  const fs::path dir = fs::temp_directory_path() / ("opforge_model_dir_" + std::to_string(::getpid())) / "Tiny-1B";
  fs::create_directories(dir);
  EXPECT_THAT(error_of([&] { load_model(dir.string()); }), HasSubstr("folder without a config.json"));
  std::ofstream(dir / "config.json") << kTiny;
  EXPECT_EQ(load_model(dir.string() + "/").hidden, 64);
  EXPECT_EQ(load_model(dir.string()).name, "Tiny-1B");
  fs::remove_all(dir.parent_path());
}

TEST(ModelConfig, BadWorkloadsAreErrors) {
  ModelSpec m = load_model("llama-3.1-8b");
  EXPECT_THAT(error_of([&] { decoder_layer(m, Workload::prefill(1, 128, 3)); }), HasSubstr("32 attention heads"));
  EXPECT_THAT(error_of([&] { decoder_layer(m, Workload::prefill(1, 128, 64)); }), HasSubstr("--tp 64"));
  EXPECT_THAT(error_of([&] { decoder_layer(m, Workload::prefill(0, 128)); }), HasSubstr("--batch"));
  EXPECT_THAT(error_of([&] { decoder_layer(m, Workload::prefill(1, -5)); }), HasSubstr("--input-len"));
  EXPECT_THAT(error_of([&] { decoder_layer(m, Workload::decode(1, 0)); }), HasSubstr("--context"));
  // tp 16 > 8 kv heads: kv heads replicate (one per GPU), query heads split.
  TpShapes s = tp_shapes(m, 16);
  EXPECT_EQ(s.q_heads, 2);
  EXPECT_EQ(s.kv_heads, 1);
}

TEST(DecoderLayer, Llama8bAtTp1And2) {
  ModelSpec m = load_model("llama-3.1-8b");
  std::vector<OpCall> l1 = decoder_layer(m, Workload::prefill(2, 512));
  EXPECT_EQ(names(l1), (std::vector<std::string>{"input_norm", "qkv_proj", "qkv_split", "rotary", "attention", "o_proj",
                                                 "post_attn_norm", "gate_up_proj", "act", "down_proj"}));
  EXPECT_EQ(find(l1, "input_norm").dims, (perfdb::Dims{{"tokens", 1024}, {"hidden", 4096}}));
  EXPECT_EQ(find(l1, "qkv_proj").dims, (perfdb::Dims{{"tokens", 1024}, {"n", 6144}, {"k", 4096}}));
  EXPECT_EQ(find(l1, "rotary").dims,
            (perfdb::Dims{{"tokens", 1024}, {"q_heads", 32}, {"kv_heads", 8}, {"head_size", 128}}));
  EXPECT_EQ(find(l1, "attention").dims,
            (perfdb::Dims{{"batch", 2}, {"tokens", 512}, {"q_heads", 32}, {"kv_heads", 8}, {"head_dim", 128}}));
  EXPECT_EQ(find(l1, "o_proj").dims, (perfdb::Dims{{"tokens", 1024}, {"n", 4096}, {"k", 4096}}));
  EXPECT_EQ(find(l1, "gate_up_proj").dims, (perfdb::Dims{{"tokens", 1024}, {"n", 28672}, {"k", 4096}}));
  EXPECT_EQ(find(l1, "act").dims, (perfdb::Dims{{"tokens", 1024}, {"d", 14336}}));
  EXPECT_EQ(find(l1, "down_proj").dims, (perfdb::Dims{{"tokens", 1024}, {"n", 4096}, {"k", 14336}}));

  std::vector<OpCall> l2 = decoder_layer(m, Workload::decode(8, 2048, 2));
  EXPECT_EQ(names(l2), (std::vector<std::string>{"input_norm", "qkv_proj", "qkv_split", "rotary", "attention", "o_proj",
                                                 "attn_all_reduce", "post_attn_norm", "gate_up_proj", "act",
                                                 "down_proj", "mlp_all_reduce"}));
  EXPECT_EQ(find(l2, "qkv_proj").dims, (perfdb::Dims{{"tokens", 8}, {"n", 3072}, {"k", 4096}}));
  EXPECT_EQ(find(l2, "attention").dims,
            (perfdb::Dims{{"batch", 8}, {"context", 2048}, {"q_heads", 16}, {"kv_heads", 4}, {"head_dim", 128}}));
  EXPECT_EQ(find(l2, "o_proj").dims, (perfdb::Dims{{"tokens", 8}, {"n", 4096}, {"k", 2048}}));
  EXPECT_EQ(find(l2, "attn_all_reduce").dims, (perfdb::Dims{{"message_bytes", 8 * 4096 * 2}, {"tp", 2}}));
  EXPECT_EQ(find(l2, "gate_up_proj").dims, (perfdb::Dims{{"tokens", 8}, {"n", 14336}, {"k", 4096}}));
  EXPECT_EQ(find(l2, "down_proj").dims, (perfdb::Dims{{"tokens", 8}, {"n", 4096}, {"k", 7168}}));

  std::vector<OpCall> head = model_head(m, Workload::prefill(2, 512, 2));
  EXPECT_EQ(find(head, "lm_head").dims, (perfdb::Dims{{"tokens", 2}, {"n", 64128}, {"k", 4096}}));
  EXPECT_EQ(find(head, "embedding").dims, (perfdb::Dims{{"tokens", 1024}, {"vocab", 128256}, {"hidden", 4096}}));
}

TEST(DecoderLayer, Qwen3MoeExpertsAtExpectedLoad) {
  ModelSpec m = load_model("qwen3-30b-a3b");
  EXPECT_EQ(expected_active_experts(128, 8, 1), 8);
  EXPECT_EQ(expected_active_experts(128, 8, 4096), 128);
  EXPECT_EQ(expected_active_experts(8, 2, 1), 2);
  std::vector<OpCall> d = decoder_layer(m, Workload::decode(1, 2048));
  EXPECT_EQ(find(d, "expert_gate_up").count, 8);
  EXPECT_EQ(find(d, "expert_gate_up").dims, (perfdb::Dims{{"tokens", 1}, {"n", 1536}, {"k", 2048}}));
  EXPECT_EQ(find(d, "q_norm").dims, (perfdb::Dims{{"tokens", 32}, {"hidden", 128}}));
  EXPECT_EQ(find(d, "k_norm").dims, (perfdb::Dims{{"tokens", 4}, {"hidden", 128}}));
  std::vector<OpCall> p = decoder_layer(m, Workload::prefill(1, 2048));
  EXPECT_EQ(find(p, "expert_gate_up").count, 128);
  EXPECT_EQ(find(p, "expert_gate_up").dims.at("tokens"), 2048 * 8 / 128);
  EXPECT_EQ(find(p, "expert_act").dims, (perfdb::Dims{{"tokens", 2048 * 8}, {"d", 768}}));
  EXPECT_EQ(find(p, "topk_softmax").dims, (perfdb::Dims{{"tokens", 2048}, {"experts", 128}, {"k", 8}}));
  const perfdb::Dims routing{{"tokens", 2048}, {"hidden", 2048}, {"experts", 128}, {"k", 8}};
  EXPECT_EQ(find(p, "moe_permute").dims, routing);
  EXPECT_EQ(find(p, "moe_unpermute").dims, routing);
  EXPECT_EQ(find(p, "moe_unpermute").op, "moe_unpermute");
}

// Note [moe row spread]: Binomial(T, k/E) rows per expert, E * P(rows) experts at each count.
TEST(DecoderLayer, MoeRowSpreadIsTheBinomialLoad) {
  const std::vector<RowsShare> one = expert_row_spread(128, 8, 1);  // decode at batch 1: k experts, 1 row
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].rows, 1);
  EXPECT_NEAR(one[0].experts, 8.0, 1e-12);
  const std::vector<RowsShare> all = expert_row_spread(4, 4, 10);  // every expert takes every token
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].rows, 10);
  EXPECT_DOUBLE_EQ(all[0].experts, 4.0);
  // T = 2: rows 1 and 2 with E * 2p(1-p) and E * p^2 experts (p = 1/16).
  const std::vector<RowsShare> two = expert_row_spread(128, 8, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_NEAR(two[0].experts, 128 * 2 * (1.0 / 16) * (15.0 / 16), 1e-9);
  EXPECT_NEAR(two[1].experts, 128 * (1.0 / 16) * (1.0 / 16), 1e-9);
  for (int64_t T : {1, 3, 32, 128, 512, 2048, 8192, 65536}) {
    const std::vector<RowsShare> s = expert_row_spread(128, 8, T);
    ASSERT_FALSE(s.empty());
    EXPECT_LE(s.size(), size_t(kMaxSpreadPoints)) << T;
    double experts = 0, pairs = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_GE(s[i].rows, 1);
      EXPECT_LE(s[i].rows, T);
      if (i > 0) EXPECT_GT(s[i].rows, s[i - 1].rows) << T;
      experts += s[i].experts;
      pairs += s[i].experts * double(s[i].rows);
    }
    const double active = 128.0 * (1.0 - std::pow(15.0 / 16.0, double(T)));  // E (1 - (1 - p)^T)
    EXPECT_NEAR(experts, active, 1e-6 * active) << T;
    EXPECT_NEAR(pairs, 8.0 * double(T), 0.01 * 8.0 * double(T)) << T;  // bins round their mean rows
  }
  // Qwen3-30B-A3B at 128 tokens: mean 8 rows, and experts at 3 and at 14 rows both take a share.
  const std::vector<RowsShare> q = expert_row_spread(128, 8, 128);
  EXPECT_LE(q.front().rows, 3);
  EXPECT_GE(q.back().rows, 14);
  EXPECT_TRUE(expert_row_spread(0, 8, 4).empty());
}

TEST(Estimator, MoeExpertGemmsCostTheirRowSpread) {
  ModelSpec m = parse_model_config(kTinyMoe, "tiny-moe.json");  // 4 experts, top 2
  Workload pre = Workload::prefill(1, 9);
  SyntheticDb db;
  db.add(decoder_layer(m, pre));
  db.write();
  const std::vector<EstimateRow> rows = estimate_calls(db.load(), decoder_layer(m, pre), "auto", "bf16", {});
  bool seen = false;
  for (const EstimateRow& r : rows) {
    if (r.call.name != "expert_gate_up") continue;
    seen = true;
    ASSERT_GT(r.call.spread.size(), 2u);  // Binomial(9, 1/2): rows 1..9
    const double want = db.call_us(r.call);
    EXPECT_NEAR(r.stored_total_us, want, 1e-9 * want);
    EXPECT_NEAR(r.answer.us * double(r.call.count), want, 1e-9 * want);
    // Not the mean rows' time times the experts: the synthetic time is not linear in rows.
    EXPECT_GT(std::abs(want - double(r.call.count) * SyntheticDb::us_of(r.call.dims)), 1e-3);
    EXPECT_THAT(r.answer.how, HasSubstr("moe row spread"));
  }
  EXPECT_TRUE(seen);
}

TEST(Estimator, SumsTheSyntheticDatabaseExactly) {
  ModelSpec m = load_model("llama-3.1-8b");
  EstimateOptions o;
  o.batch = 4;
  o.input_len = 256;
  o.output_len = 64;
  Workload pre = Workload::prefill(4, 256), dec = Workload::decode(4, 256 + 32);
  SyntheticDb db;
  for (const Workload& w : {pre, dec}) {
    db.add(decoder_layer(m, w));
    db.add(model_head(m, w));
  }
  db.write();
  Estimate e = estimate(m, db.load(), o);
  const double layer_p = db.expected(decoder_layer(m, pre)), head_p = db.expected(model_head(m, pre));
  const double layer_d = db.expected(decoder_layer(m, dec)), head_d = db.expected(model_head(m, dec));
  EXPECT_NEAR(e.prefill.layer_us, layer_p, 1e-9 * layer_p);
  EXPECT_NEAR(e.prefill.head_us, head_p, 1e-9 * head_p);
  EXPECT_NEAR(e.ttft_us, 32 * layer_p + head_p, 1e-9 * e.ttft_us);
  EXPECT_NEAR(e.tpot_us, 32 * layer_d + head_d, 1e-9 * e.tpot_us);
  EXPECT_NEAR(e.tokens_per_s, 4 / (e.tpot_us * 1e-6), 1e-6 * e.tokens_per_s);
  EXPECT_EQ(e.decode.workload.context, 288);
  double shares = 0;
  for (const EstimateRow& r : e.prefill.layer) {
    shares += r.share;
    if (r.call.modelled_bytes > 0) {
      EXPECT_EQ(r.answer.method, perfdb::Method::modelled);
    } else {
      EXPECT_EQ(r.answer.impl, "cpu") << r.call.name;  // "auto": the faster impl
      EXPECT_EQ(r.answer.method, perfdb::Method::measured);
    }
  }
  EXPECT_NEAR(shares, 1.0, 1e-9);
  EXPECT_THAT(format_estimate(e), HasSubstr("TTFT"));
}

// Note [ceilings now]: each answer scales by stored / now of the ceiling that bounds the call at
// the stored ceilings (the synthetic tables: 20 GB/s, 100 GFLOP/s); the unscaled sums stay.
TEST(Estimator, CeilingsNowScaleEachRowByItsBound) {
  ModelSpec m = load_model("llama-3.1-8b");
  EstimateOptions o;
  o.input_len = 512;
  o.output_len = 0;
  const Workload pre = Workload::prefill(1, 512), dec = Workload::decode(1, 512);
  SyntheticDb db;
  for (const Workload& w : {pre, dec}) {
    db.add(decoder_layer(m, w));
    db.add(model_head(m, w));
  }
  db.write();
  const perfdb::Database d = db.load();
  const double layer_p = db.expected(decoder_layer(m, pre));

  o.now = {10.0, 50.0};  // both halved: a call its ceiling fully explains takes twice as long
  Estimate both = estimate(m, d, o);
  // At 512 tokens every layer call's roofline time at the stored ceilings exceeds its synthetic
  // time (share 1): the layer doubles exactly.
  EXPECT_NEAR(both.prefill.layer_us, 2 * layer_p, 1e-9 * layer_p);
  EXPECT_NEAR(both.prefill.layer_stored_us, layer_p, 1e-9 * layer_p);
  // A decode step's norm of one token moves 16 KiB, 0.8 us at 20 GB/s, under its stored time:
  // only that share of it doubles.
  const EstimateRow& norm = *std::find_if(both.decode.layer.begin(), both.decode.layer.end(),
                                          [](const EstimateRow& r) { return r.call.name == "input_norm"; });
  const Cost nc = perfdb::cost_at(norm.call.op, "bf16", norm.call.dims);
  const double share = nc.bytes / (20.0 * 1e3) / norm.answer.us;
  ASSERT_LT(share, 1.0);
  EXPECT_NEAR(norm.scale, share * 2 + (1 - share), 1e-12);
  EXPECT_GT(both.ttft_us, both.ttft_stored_us);
  EXPECT_LE(both.ttft_us, 2 * both.ttft_stored_us * (1 + 1e-12));

  o.now = {20.0, 25.0};  // only the GEMM ceiling moved: the GEMMs scale by 4, the norms not at all
  Estimate gemm = estimate(m, d, o);
  for (const EstimateRow& r : gemm.prefill.layer) {
    if (r.call.op == "linear") {
      EXPECT_DOUBLE_EQ(r.scale, 4.0) << r.call.name;
      EXPECT_THAT(r.scale_how, HasSubstr("at the GEMM ceiling, 100.0 -> 25.0 GFLOP/s")) << r.call.name;
    } else if (r.call.op == "rms_norm" || r.call.op == "fused_add_rms_norm" || r.call.modelled_bytes > 0) {
      EXPECT_DOUBLE_EQ(r.scale, 1.0) << r.call.name;
    }
    EXPECT_NEAR(r.total_us, r.stored_total_us * r.scale, 1e-12 * r.total_us);
  }
  EXPECT_GT(gemm.prefill.layer_us, layer_p);
  EXPECT_LT(gemm.prefill.layer_us, 4 * layer_p);
  EXPECT_THAT(format_estimate(gemm), HasSubstr("scaled to the ceilings measured now"));
  EXPECT_THAT(estimate_json(gemm), HasSubstr("\"ceilings_now\""));

  o.now = {};  // not scaled: the figures are the stored ones
  Estimate plain = estimate(m, d, o);
  EXPECT_EQ(plain.prefill.layer_us, plain.prefill.layer_stored_us);
  for (const EstimateRow& r : plain.prefill.layer) EXPECT_TRUE(r.scale_how.empty());
  EXPECT_THAT(format_estimate(plain), Not(HasSubstr("scaled to")));
}

TEST(Estimator, MissingOpIsPerfDataNotAvailable) {
  ModelSpec m = load_model("llama-3.1-8b");
  EstimateOptions o;
  o.input_len = 128;
  o.output_len = 0;
  SyntheticDb db;
  for (const Workload& w : {Workload::prefill(1, 128), Workload::decode(1, 128)}) {
    db.add(decoder_layer(m, w));
    db.add(model_head(m, w));
  }
  db.write({"rotary_embedding"});
  perfdb::Database d = db.load();
  std::string msg = error_of<perfdb::PerfDataNotAvailable>([&] { estimate(m, d, o); });
  EXPECT_THAT(msg, HasSubstr("rotary"));
  std::vector<SupportRow> rows = model_support(m, d, o);
  int missing = 0;
  for (const SupportRow& r : rows) {
    missing += r.ok ? 0 : 1;
    if (!r.ok) {
      EXPECT_EQ(r.call.op, "rotary_embedding");
    }
  }
  EXPECT_EQ(missing, 2);  // prefill and decode
  EXPECT_THAT(format_support(rows), HasSubstr("missing"));
}

TEST(Estimator, AllReduceMeasuredOrRingModel) {
  ModelSpec m = load_model("llama-3.1-8b");
  EstimateOptions o;
  o.tp = 2;
  o.input_len = 64;
  o.output_len = 0;
  SyntheticDb db;
  for (const Workload& w : {Workload::prefill(1, 64, 2), Workload::decode(1, 64, 2)}) {
    db.add(decoder_layer(m, w));
    db.add(model_head(m, w));
  }
  std::map<perfdb::Dims, double> ar = db.points["all_reduce"];
  db.points.erase("all_reduce");
  db.write();
  Estimate e = estimate(m, db.load(), o);
  const EstimateRow* row = nullptr;
  for (const EstimateRow& r : e.prefill.layer)
    if (r.call.name == "attn_all_reduce") row = &r;
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->answer.method, perfdb::Method::modelled);
  // Ring model on a system without NVLink in its name: copy ceiling, 1 us per step; tp 2: 2 steps.
  const double bytes = 64.0 * 4096 * 2;
  EXPECT_NEAR(row->answer.us, bytes / (20.0 * 1e3) + 2.0, 1e-9);
  db.points["all_reduce"] = ar;
  db.write();
  Estimate e2 = estimate(m, db.load(), o);
  for (const EstimateRow& r : e2.prefill.layer)
    if (r.call.op == "all_reduce") {
      EXPECT_EQ(r.answer.method, perfdb::Method::measured);
    }
}

// A message below the smallest measured one (a small hidden size at batch 1) takes that message's
// time: all_reduce has no cost model to extrapolate with.
TEST(Estimator, AllReduceBelowTheSmallestMessage) {
  ModelSpec m = parse_model_config(kTiny, "tiny.json");
  SyntheticDb db;
  db.add(decoder_layer(m, Workload::decode(1, 8, 2)));
  db.points["all_reduce"] = {{{{"message_bytes", 4096}, {"tp", 2}}, 12.5}, {{{"message_bytes", 8192}, {"tp", 2}}, 13.0}};
  db.write();
  const std::vector<OpCall> layer = decoder_layer(m, Workload::decode(1, 8, 2));
  const OpCall& c = find(layer, "attn_all_reduce");
  ASSERT_EQ(c.dims.at("message_bytes"), 128);
  perfdb::Answer a = answer_call(db.load(), c, "auto", "bf16");
  EXPECT_DOUBLE_EQ(a.us, 12.5);
  EXPECT_EQ(a.method, perfdb::Method::extrapolated);
  EXPECT_THAT(a.how, HasSubstr("below the smallest measured message"));
}

TEST(Estimator, RingModelIsCalibratedOnMeasuredTp) {
  ModelSpec m = load_model("llama-3.1-8b");
  SyntheticDb db;
  const double bw = 100.0, lat = 3.0;  // GB/s, us per step
  auto ring = [&](double bytes, int64_t tp) { return 2.0 * (tp - 1) / tp * bytes / (bw * 1e3) + 2.0 * (tp - 1) * lat; };
  for (int64_t bytes : {int64_t(1024), int64_t(1) << 20, int64_t(1) << 28})
    db.points["all_reduce"][{{"message_bytes", bytes}, {"tp", 2}}] = ring(double(bytes), 2);
  for (const Workload& w : {Workload::prefill(1, 64, 4)}) db.add(decoder_layer(m, w));
  db.points["all_reduce"].erase(find(decoder_layer(m, Workload::prefill(1, 64, 4)), "attn_all_reduce").dims);
  db.write();
  perfdb::Database d = db.load();
  RingModel r = ring_model(d);
  EXPECT_NEAR(r.step_latency_us, lat, 0.01 * lat);
  EXPECT_NEAR(r.bus_gbps, bw, 0.01 * bw);
  EXPECT_THAT(r.source, HasSubstr("calibrated"));
  const std::vector<OpCall> layer = decoder_layer(m, Workload::prefill(1, 64, 4));  // outlives c
  const OpCall& c = find(layer, "attn_all_reduce");
  perfdb::Answer a = answer_call(d, c, "auto", "bf16");
  EXPECT_EQ(a.method, perfdb::Method::modelled);
  EXPECT_NEAR(a.us, ring(double(c.dims.at("message_bytes")), 4), 0.01 * a.us);
}

TEST(Estimator, JsonHasTheFields) {
  ModelSpec m = parse_model_config(kTinyMoe, "tiny-moe.json");
  EstimateOptions o;
  o.batch = 2;
  o.input_len = 16;
  o.output_len = 8;
  SyntheticDb db;
  for (const Workload& w : {Workload::prefill(2, 16), Workload::decode(2, 20)}) {
    db.add(decoder_layer(m, w));
    db.add(model_head(m, w));
  }
  db.write();
  Estimate e = estimate(m, db.load(), o);
  nlohmann::json j = nlohmann::json::parse(estimate_json(e));
  for (const char* k : {"model", "system", "tp", "batch", "input_len", "output_len", "dtype", "ttft_us", "tpot_us",
                        "tokens_per_s", "prefill", "decode", "decode_context"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_DOUBLE_EQ(j["ttft_us"].get<double>(), e.ttft_us);
  const nlohmann::json& row = j["prefill"]["layer"][0];
  for (const char* k : {"name", "op", "kernel", "shapes", "dims", "calls", "us_per_call", "us", "share", "method", "how"})
    EXPECT_TRUE(row.contains(k)) << k;
  EXPECT_TRUE(j["decode"].contains("layer_us"));
  EXPECT_TRUE(j["decode"].contains("head_us"));
  bool combine = false, split = false;
  for (const auto& r : j["prefill"]["layer"]) {
    combine |= r["name"] == "moe_unpermute" && r["method"] == "measured";
    split |= r["name"] == "qkv_split" && r["method"] == "modelled";
  }
  EXPECT_TRUE(combine);
  EXPECT_TRUE(split);
}

TEST(RunLayer, TinyDenseAndMoeLayersRunOnCpu) {
  for (const char* text : {kTiny, kTinyMoe}) {
    ModelSpec m = parse_model_config(text, "tiny.json");
    for (const Workload& w : {Workload::prefill(2, 8), Workload::decode(3, 17)}) {
      RunLayerOptions o;
      o.workload = w;
      o.repeat = 2;
      LayerRun r = run_layer(m, o);
      EXPECT_GT(r.layer_us, 0);
      std::set<std::string> seen;
      for (const MeasuredRow& row : r.rows) {
        EXPECT_GT(row.us, 0) << row.name;
        seen.insert(row.name);
      }
      // Every call of the estimator's layer has a measured row of the same name.
      for (const OpCall& c : decoder_layer(m, w)) EXPECT_TRUE(seen.count(c.name)) << c.name;
      if (m.is_moe()) {
        EXPECT_TRUE(seen.count("moe_permute"));
        EXPECT_TRUE(seen.count("moe_unpermute"));
      }
      SyntheticDb db;
      db.add(decoder_layer(m, w));
      db.write();
      perfdb::Database d = db.load();
      std::vector<EstimateRow> pred = estimate_calls(d, decoder_layer(m, w), "auto", "bf16");
      std::string text_out = format_run(m, r, &pred, db.system);
      EXPECT_THAT(text_out, HasSubstr("predicted"));
      nlohmann::json j = nlohmann::json::parse(run_json(m, r, &pred, db.system));
      EXPECT_GT(j["layer_predicted_us"].get<double>(), 0);
    }
  }
}

TEST(RunLayer, PassesAndBadRepeatPassesOrGraphLayers) {
  ModelSpec m = parse_model_config(kTiny, "tiny.json");
  RunLayerOptions o;
  o.workload = Workload::prefill(1, 4);
  o.repeat = 0;
  EXPECT_THROW(run_layer(m, o), Error);
  o.repeat = 1;
  o.passes = -1;
  EXPECT_THROW(run_layer(m, o), Error);
  o.passes = 2;
  LayerRun two = run_layer(m, o);
  EXPECT_EQ(two.passes, 2);
  EXPECT_THAT(format_run(m, two, nullptr, ""), HasSubstr("the fastest of 2 passes"));
  o.graph_layers = 0;
  try {
    run_layer(m, o);
    ADD_FAILURE() << "graph_layers 0 accepted";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("--graph-layers"));
  }
}
