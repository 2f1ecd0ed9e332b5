// Hugging Face config.json -> ModelSpec.
//
// Field names per family (as the transformers configs of those architectures write them):
//   all:       hidden_size, intermediate_size, num_attention_heads, num_hidden_layers, vocab_size;
//              num_key_value_heads (default num_attention_heads), head_dim (default hidden_size /
//              num_attention_heads), rms_norm_eps, rope_theta, max_position_embeddings,
//              torch_dtype, tie_word_embeddings
//   Mixtral:   num_local_experts, num_experts_per_tok (the expert MLP is intermediate_size wide;
//              top-k weights are always renormalized)
//   Qwen3-MoE: num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob
//   Gemma 3:   the text dims may sit under "text_config" (Gemma3ForConditionalGeneration files).
//   missing:   Note [missing fields] below.
//   sliding windows: layer_types, sliding_window, sliding_window_pattern (Gemma 3),
//              use_sliding_window and max_window_layers (Qwen), read_windows below.
#include <cctype>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "opforge/error.h"

namespace opforge::model {

namespace fs = std::filesystem;
using nlohmann::json;

const char* family_name(Family f) {
  switch (f) {
    case Family::llama: return "llama";
    case Family::mistral: return "mistral";
    case Family::qwen2: return "qwen2";
    case Family::qwen3: return "qwen3";
    case Family::gemma2: return "gemma2";
    case Family::gemma3: return "gemma3";
    case Family::mixtral: return "mixtral";
    case Family::qwen3_moe: return "qwen3_moe";
  }
  return "?";
}

const std::vector<Architecture>& supported_architectures() {
  static const std::vector<Architecture> archs = {
      {"LlamaForCausalLM", Family::llama},        {"MistralForCausalLM", Family::mistral},
      {"Qwen2ForCausalLM", Family::qwen2},        {"Qwen3ForCausalLM", Family::qwen3},
      {"Gemma2ForCausalLM", Family::gemma2},      {"Gemma3ForCausalLM", Family::gemma3},
      {"Gemma3ForConditionalGeneration", Family::gemma3},
      {"MixtralForCausalLM", Family::mixtral},    {"Qwen3MoeForCausalLM", Family::qwen3_moe},
  };
  return archs;
}

std::string supported_architecture_list() {
  std::string s;
  for (const Architecture& a : supported_architectures()) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

namespace {

struct Reader {
  const json& doc;
  const std::string& source;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(ErrorCode::parse, source + ": field '" + field + "': " + what);
  }
  bool has(const char* field) const { return doc.contains(field) && !doc[field].is_null(); }
  int64_t integer(const char* field) const {
    if (!has(field)) fail(field, "missing (needed to build the model's layers)");
    const json& v = doc[field];
    if (!v.is_number_integer()) fail(field, "expected an integer, got " + v.dump());
    // An unsigned value past int64 would read back negative: name it as written.
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) fail(field, "past int64, got " + v.dump());
    int64_t x = v.get<int64_t>();
    if (x <= 0) fail(field, "expected a positive integer, got " + std::to_string(x));
    return x;
  }
  int64_t integer_or(const char* field, int64_t fallback) const { return has(field) ? integer(field) : fallback; }
  double number_or(const char* field, double fallback) const {
    if (!has(field)) return fallback;
    if (!doc[field].is_number()) fail(field, "expected a number, got " + doc[field].dump());
    return doc[field].get<double>();
  }
  bool boolean_or(const char* field, bool fallback) const {
    if (!has(field)) return fallback;
    if (!doc[field].is_boolean()) fail(field, "expected true or false, got " + doc[field].dump());
    return doc[field].get<bool>();
  }
  std::string string_or(const char* field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    if (!doc[field].is_string()) fail(field, "expected a string, got " + doc[field].dump());
    return doc[field].get<std::string>();
  }
};

// Which layers attend to a sliding window only (Note [sliding-window layers] in layer.cpp): a
// "layer_types" list when the file has one; else Gemma 2 every other layer (the even ones), Gemma
// 3 all but every sliding_window_pattern-th (default 6), Mistral / Mixtral every layer when
// sliding_window is set, Qwen2 / Qwen3 the layers from max_window_layers on when
// use_sliding_window is true. Gemma's window defaults to 4096 as in transformers.
void read_windows(const Reader& r, ModelSpec& m) {
  const json& d = r.doc;
  if (d.contains("layer_types") && !d["layer_types"].is_null()) {
    const json& types = d["layer_types"];
    if (!types.is_array() || int64_t(types.size()) != m.layers)
      r.fail("layer_types", "expected a list of " + std::to_string(m.layers) + " layer types, got " + types.dump());
    int64_t local = 0;
    for (const json& t : types) {
      const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
      if (name == "sliding_attention") ++local;
      else if (name != "full_attention")
        r.fail("layer_types", "expected \"sliding_attention\" or \"full_attention\", got " + t.dump());
    }
    if (local > 0) {
      // Gemma's window has a class default (the files that list layer_types may leave it out).
      m.sliding_window = m.is_gemma() ? r.integer_or("sliding_window", 4096) : r.integer("sliding_window");
      m.window_layers = local;
    }
    return;
  }
  switch (m.family) {
    case Family::gemma2:
      m.sliding_window = r.integer_or("sliding_window", 4096);
      m.window_layers = m.layers / 2 + m.layers % 2;  // layers 0, 2, 4, ...
      break;
    case Family::gemma3:
      m.sliding_window = r.integer_or("sliding_window", 4096);
      m.window_layers = m.layers - m.layers / r.integer_or("sliding_window_pattern", 6);
      break;
    case Family::mistral:
    case Family::mixtral:
      if (r.has("sliding_window")) m.sliding_window = r.integer("sliding_window"), m.window_layers = m.layers;
      break;
    case Family::qwen2:
    case Family::qwen3:
    case Family::qwen3_moe:
      if (r.boolean_or("use_sliding_window", false) && r.has("sliding_window")) {
        m.sliding_window = r.integer("sliding_window");
        int64_t from = m.layers;
        if (r.has("max_window_layers")) {
          if (!d["max_window_layers"].is_number_integer() || d["max_window_layers"].get<int64_t>() < 0)
            r.fail("max_window_layers", "expected an integer >= 0, got " + d["max_window_layers"].dump());
          from = d["max_window_layers"].get<int64_t>();
        }
        m.window_layers = std::max<int64_t>(0, m.layers - from);
      }
      break;
    default:
      break;
  }
}

// Note [missing fields]: transformers fills a field a config.json leaves out from the defaults of
// the family's config class, and vLLM builds the model from that filled object. The published Gemma
// 3 multimodal files rely on it: gemma-3-4b's text_config names neither its heads, its kv heads,
// its head_dim nor its vocab, and gemma-3-12b's head_dim (256) is not hidden_size / heads (240).
// So where those class defaults are the dims of the family's models, opforge takes them too:
// Gemma 2 (Gemma2Config) and Gemma 3 (Gemma3TextConfig) 8 heads, 4 kv heads, head_dim 256 and
// vocab 256000 / 262208; Qwen3 (Qwen3Config) head_dim 128. Elsewhere hidden_size,
// intermediate_size, num_attention_heads, num_hidden_layers and vocab_size are required (a class
// default there, Llama's 4096 hidden, is no model's), num_key_value_heads defaults to the heads
// (Llama's rule; transformers' Mistral, Mixtral and Qwen classes would take a fixed count, 8 or
// 32, which for a file without the field is no better a guess) and head_dim to hidden_size /
// num_attention_heads. ModelSpec::defaulted lists what was filled in; the estimate prints it.
struct FamilyDefaults {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;  // 0: none (required or derived)
};

FamilyDefaults family_defaults(Family f) {
  switch (f) {
    case Family::gemma2: return {8, 4, 256, 256000};
    case Family::gemma3: return {8, 4, 256, 262208};
    case Family::qwen3: return {0, 0, 128, 0};
    default: return {};
  }
}

Family family_of(const json& doc, const std::string& source, std::string& arch) {
  if (!doc.contains("architectures") || !doc["architectures"].is_array() || doc["architectures"].empty() ||
      !doc["architectures"][0].is_string())
    throw Error(ErrorCode::parse, source + ": field 'architectures': missing or not a list of names "
                                           "(supported: " + supported_architecture_list() + ")");
  arch = doc["architectures"][0].get<std::string>();
  for (const Architecture& a : supported_architectures())
    if (arch == a.name) return a.family;
  throw Error(ErrorCode::unknown_name, source + ": unsupported architecture '" + arch +
                                           "'; supported: " + supported_architecture_list());
}

std::string stem_of(const std::string& source) {
  fs::path p(source);
  std::string stem = p.stem().string();
  if (stem == "config" && p.has_parent_path()) stem = p.parent_path().filename().string();
  return stem;
}

}  // namespace

ModelSpec parse_model_config(const std::string& json_text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw Error(ErrorCode::parse, source + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object()) throw Error(ErrorCode::parse, source + ": expected a JSON object");
  ModelSpec m;
  m.path = source;
  m.name = stem_of(source);
  m.family = family_of(doc, source, m.architecture);
  // Gemma 3 multimodal files keep the language model's dims under text_config.
  const json& text = doc.contains("text_config") && doc["text_config"].is_object() ? doc["text_config"] : doc;
  Reader r{text, source};
  // Note [missing fields]
  const FamilyDefaults def = family_defaults(m.family);
  auto defaulted = [&](const char* field, int64_t fallback) {
    if (r.has(field) || fallback == 0) return r.integer(field);
    m.defaulted.push_back(std::string(field) + " " + std::to_string(fallback));
    return fallback;
  };
  m.hidden = r.integer("hidden_size");
  m.heads = defaulted("num_attention_heads", def.heads);
  m.kv_heads = r.has("num_key_value_heads") || def.kv_heads == 0 ? r.integer_or("num_key_value_heads", m.heads)
                                                                  : defaulted("num_key_value_heads", def.kv_heads);
  if (r.has("head_dim") || def.head_dim > 0) {
    m.head_dim = defaulted("head_dim", def.head_dim);
  } else {
    if (m.hidden % m.heads != 0)
      r.fail("head_dim", "missing, and hidden_size " + std::to_string(m.hidden) +
                             " is not a multiple of num_attention_heads " + std::to_string(m.heads));
    m.head_dim = m.hidden / m.heads;
  }
  if (m.heads % m.kv_heads != 0)
    r.fail("num_key_value_heads", "expected a divisor of num_attention_heads " + std::to_string(m.heads) +
                                      ", got " + std::to_string(m.kv_heads) +
                                      (r.has("num_key_value_heads") ? "" : " (the family's default)"));
  if (m.head_dim % 2 != 0) r.fail("head_dim", "expected an even size (rotary pairs), got " + std::to_string(m.head_dim));
  m.layers = r.integer("num_hidden_layers");
  m.vocab = defaulted("vocab_size", def.vocab);
  m.rms_norm_eps = r.number_or("rms_norm_eps", 1e-6);
  m.rope_theta = r.number_or("rope_theta", 10000.0);
  m.max_position = r.integer_or("max_position_embeddings", 0);
  m.torch_dtype = r.string_or("torch_dtype", Reader{doc, source}.string_or("torch_dtype", ""));
  m.tie_word_embeddings = Reader{doc, source}.boolean_or("tie_word_embeddings", r.boolean_or("tie_word_embeddings", false));
  switch (m.family) {
    case Family::mixtral:
      m.intermediate = r.integer("intermediate_size");
      m.experts = r.integer("num_local_experts");
      m.experts_per_token = r.integer("num_experts_per_tok");
      m.moe_intermediate = m.intermediate;
      m.norm_topk_prob = true;
      break;
    case Family::qwen3_moe:
      m.intermediate = r.integer_or("intermediate_size", 0);
      m.experts = r.integer("num_experts");
      m.experts_per_token = r.integer("num_experts_per_tok");
      m.moe_intermediate = r.integer("moe_intermediate_size");
      m.norm_topk_prob = r.boolean_or("norm_topk_prob", false);  // Qwen3MoeConfig's default
      // Every layer is costed as an MoE layer: a file with dense MLP layers between them (as
      // transformers reads mlp_only_layers and decoder_sparse_step) is refused, not misread.
      if (r.integer_or("decoder_sparse_step", 1) != 1)
        r.fail("decoder_sparse_step", "only 1 (every layer an MoE layer) is modelled, got " +
                                          std::to_string(r.integer("decoder_sparse_step")));
      if (text.contains("mlp_only_layers") && !text["mlp_only_layers"].is_null() &&
          !(text["mlp_only_layers"].is_array() && text["mlp_only_layers"].empty()))
        r.fail("mlp_only_layers", "dense layers between the MoE layers are not modelled; expected [], got " +
                                      text["mlp_only_layers"].dump());
      break;
    default:
      m.intermediate = r.integer("intermediate_size");
  }
  read_windows(r, m);
  if (m.is_moe() && m.experts_per_token > m.experts)
    r.fail("num_experts_per_tok", "expected at most the " + std::to_string(m.experts) + " experts, got " +
                                      std::to_string(m.experts_per_token));
  // Note [size limits] (layer.cpp): the weights' element counts, so that no product of these
  // sizes wraps in int64 further on.
  const std::string where = source + ": sizes too large";
  const double H = double(m.hidden);
  check_product({{"hidden_size", H}, {"(num_attention_heads + 2 num_key_value_heads)", double(m.heads) + 2.0 * double(m.kv_heads)},
                 {"head_dim", double(m.head_dim)}}, where + " (the qkv weight)");
  check_product({{"hidden_size", H}, {"2", 2}, {"intermediate_size", double(m.intermediate)}}, where + " (the MLP weight)");
  check_product({{"hidden_size", H}, {"vocab_size", double(m.vocab)}}, where + " (the embedding)");
  if (m.is_moe())
    check_product({{m.family == Family::mixtral ? "num_local_experts" : "num_experts", double(m.experts)},
                   {"hidden_size", H}, {"2", 2},
                   {m.family == Family::mixtral ? "intermediate_size" : "moe_intermediate_size", double(m.moe_intermediate)}},
                  where + " (the expert weights)");
  return m;
}

// $OPFORGE_MODELS, else this checkout's data/models, else the installed copy.
std::string models_dir() {
  if (const char* env = std::getenv("OPFORGE_MODELS"); env && *env) return env;
  std::error_code ec;
#ifdef OPFORGE_SOURCE_MODELS_DIR
  if (fs::is_directory(OPFORGE_SOURCE_MODELS_DIR, ec)) return OPFORGE_SOURCE_MODELS_DIR;
#endif
#ifdef OPFORGE_INSTALLED_MODELS_DIR
  if (fs::is_directory(OPFORGE_INSTALLED_MODELS_DIR, ec)) return OPFORGE_INSTALLED_MODELS_DIR;
#endif
  return "data/models";
}

std::vector<std::string> shipped_models() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(models_dir(), ec))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

ModelSpec load_model(const std::string& name_or_path) {
  if (name_or_path.empty()) throw Error(ErrorCode::invalid_argument, "--model: expected a model name or a config.json path");
  bool is_path = name_or_path.find('/') != std::string::npos ||
                 (name_or_path.size() > 5 && name_or_path.ends_with(".json"));
  // Shipped names match without regard to case, so the Hugging Face spelling (Llama-3.1-8B) works too.
  std::string name = name_or_path;
  if (!is_path)
    for (const std::string& n : shipped_models())
      if (std::equal(n.begin(), n.end(), name.begin(), name.end(),
                     [](char a, char b) { return std::tolower((unsigned char)a) == std::tolower((unsigned char)b); }))
        name = n;
  std::string path = is_path ? name_or_path : (fs::path(models_dir()) / (name + ".json")).string();
  // A Hugging Face model folder (a snapshot, a local clone) keeps its config as config.json; a
  // folder read as a file would only say "not valid JSON".
  std::error_code ec;
  if (is_path && fs::is_directory(path, ec)) {
    path = (fs::path(path) / "config.json").string();
    if (!fs::is_regular_file(path, ec))
      throw Error(ErrorCode::io, "model config: " + name_or_path + " is a folder without a config.json");
  }
  std::ifstream in(path);
  if (!in) {
    if (is_path) throw Error(ErrorCode::io, "cannot read model config " + path);
    std::string names;
    for (const std::string& n : shipped_models()) names += (names.empty() ? "" : ", ") + n;
    throw Error(ErrorCode::unknown_name, "unknown model '" + name_or_path + "'; shipped: " +
                                             (names.empty() ? "(none found in " + models_dir() + ")" : names) +
                                             "; or give a path to a config.json");
  }
  std::stringstream text;
  text << in.rdbuf();
  ModelSpec m = parse_model_config(text.str(), path);
  if (!is_path) m.name = name_or_path;
  return m;
}

}  // namespace opforge::model
