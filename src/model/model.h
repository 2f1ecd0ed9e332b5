// Model families from Hugging Face config.json files, and the decoder layer of a family as a list
// of op calls with the dims the performance database is queried with (perfdb::op_grid).
//
//   ModelSpec m = load_model("llama-3.1-8b");          // data/models/llama-3.1-8b.json
//   ModelSpec m = load_model("path/to/config.json");   // any file
//   std::vector<OpCall> layer = decoder_layer(m, Workload::prefill(1, 2048, /*tp=*/2));
//
// The layer mapping per family, the MoE expected-load rule and the TP rule are described in
// docs/design.md, section "Estimator".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/perfdb.h"

namespace opforge::model {

enum class Family { llama, mistral, qwen2, qwen3, gemma2, gemma3, mixtral, qwen3_moe };
const char* family_name(Family f);

// architectures[0] values opforge knows, and the family each maps to.
struct Architecture {
  const char* name;
  Family family;
};
const std::vector<Architecture>& supported_architectures();
std::string supported_architecture_list();  // "LlamaForCausalLM, MistralForCausalLM, ..."

struct ModelSpec {
  std::string name;          // the file's stem, e.g. "llama-3.1-8b"
  std::string path;          // where it was read from
  std::string architecture;  // architectures[0]
  Family family = Family::llama;
  int64_t hidden = 0;        // hidden_size
  int64_t intermediate = 0;  // intermediate_size (dense MLP)
  int64_t heads = 0;         // num_attention_heads
  int64_t kv_heads = 0;      // num_key_value_heads (default: heads)
  int64_t head_dim = 0;      // head_dim (default: hidden / heads)
  int64_t layers = 0;        // num_hidden_layers
  int64_t vocab = 0;         // vocab_size
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  int64_t max_position = 0;  // max_position_embeddings (0: not given)
  std::string torch_dtype;   // as written, may be empty
  bool tie_word_embeddings = false;
  // Mixture of experts (Mixtral, Qwen3-MoE); experts == 0 for dense models.
  int64_t experts = 0;              // num_local_experts / num_experts
  int64_t experts_per_token = 0;    // num_experts_per_tok
  int64_t moe_intermediate = 0;     // moe_intermediate_size (Mixtral: intermediate_size)
  bool norm_topk_prob = true;       // renormalize the top-k weights (Qwen3-MoE: norm_topk_prob, default false)
  // Sliding-window attention (Note [sliding-window layers], layer.cpp): how many of the layers
  // attend to the last `sliding_window` positions only (0: none).
  int64_t sliding_window = 0;
  int64_t window_layers = 0;
  // Note [missing fields] (config.cpp): fields the file leaves out that took the family's
  // transformers default, as "name value".
  std::vector<std::string> defaulted;

  bool is_moe() const { return experts > 0; }
  bool has_qk_norm() const { return family == Family::qwen3 || family == Family::qwen3_moe || family == Family::gemma3; }
  bool is_gemma() const { return family == Family::gemma2 || family == Family::gemma3; }
};

// Parses the text of a config.json; `source` names it in error messages.
ModelSpec parse_model_config(const std::string& json_text, const std::string& source);
// A shipped model by name (data/models/<name>.json) or a path to a config.json (anything that
// ends in .json or contains a '/'). Unknown name -> Error listing the shipped ones.
ModelSpec load_model(const std::string& name_or_path);
// Folder of the shipped configs: $OPFORGE_MODELS, else data/models of this checkout.
std::string models_dir();
std::vector<std::string> shipped_models();

// ---- workloads and the layer as op calls ---------------------------------------------------

enum class Phase { prefill, decode };
const char* phase_name(Phase p);

// Prefill: `batch` sequences of `tokens` each. Decode: one new token for each of `batch`
// sequences, each attending over `context` tokens. `tp`: tensor-parallel degree (per-GPU shapes).
struct Workload {
  Phase phase = Phase::prefill;
  int64_t batch = 1;
  int64_t tokens = 0;   // prefill: tokens per sequence
  int64_t context = 0;  // decode: context length per sequence
  int64_t tp = 1;
  std::string dtype = "bf16";
  static Workload prefill(int64_t batch, int64_t tokens, int64_t tp = 1);
  static Workload decode(int64_t batch, int64_t context, int64_t tp = 1);
  int64_t total_tokens() const { return phase == Phase::prefill ? batch * tokens : batch; }
};

// Note [moe row spread] (layer.cpp): one row count of an MoE expert GEMM and the expected number
// of experts that run at it.
struct RowsShare {
  int64_t rows = 0;
  double experts = 0;
};

// How a call that is not an opforge op (no database table) is costed: the bytes it moves at the
// copy ceiling of the system. `modelled_bytes` > 0 marks such a call.
struct OpCall {
  std::string name;    // row label: "qkv_proj", "input_norm", ...
  std::string op;      // the op queried: "linear", "fused_add_rms_norm", ... or "all_reduce"
  perfdb::Dims dims;   // in perfdb::op_grid(op) order of names
  int64_t count = 1;   // calls per layer (MoE experts: the expected active experts)
  double modelled_bytes = 0;  // > 0: not an op; modelled from bytes / copy ceiling
  std::string note;    // why this count or these dims, for the table
  // MoE expert GEMMs: the spread of their rows (Note [moe row spread]); the call then costs
  // sum(experts * time at rows), and dims["tokens"] is the mean rows of an active expert.
  std::vector<RowsShare> spread;
  // Note [sliding-window layers]: the share of the layers that make this call (1: every layer),
  // and a factor on the queried time (a windowed prefill's share of the causal attention work).
  double layer_share = 1;
  double work_scale = 1;
};

// Per-GPU shapes under tensor parallelism (vLLM's rule): query heads are split tp ways and must
// divide by tp; kv heads are split when tp <= kv_heads (then they must divide by tp) and
// replicated (one per GPU) when tp > kv_heads (then tp must be a multiple of kv_heads).
struct TpShapes {
  int64_t q_heads = 0, kv_heads = 0, intermediate = 0, moe_intermediate = 0, vocab = 0;
};
TpShapes tp_shapes(const ModelSpec& m, int64_t tp);  // Error when tp does not fit the heads

// Note [size limits] (layer.cpp): the largest count a product of model sizes and workload sizes
// may reach (elements of a tensor, bytes of a row block), 2^53: exact in a double, far from
// int64's end. `factors` are (name, value) pairs; past the limit -> Error naming them and `what`.
inline constexpr double kMaxCount = 9007199254740992.0;  // 2^53
// (Values are doubles so that a sum such as heads + 2 kv heads cannot wrap before the check.)
void check_product(const std::vector<std::pair<std::string, double>>& factors, const std::string& what);
void validate_workload(const ModelSpec& m, const Workload& w);  // lengths, batch, tp, dtype

// One decoder layer (the steady-state layer of vLLM's forward) as op calls, in order.
// windows = false: every layer's attention over the whole context (run-layer's layer).
std::vector<OpCall> decoder_layer(const ModelSpec& m, const Workload& w, bool windows = true);
// What runs once per forward: embedding of every token, the final norm and the lm_head GEMM for
// the last token of each sequence (prefill) or every token (decode).
std::vector<OpCall> model_head(const ModelSpec& m, const Workload& w);
// Expected number of distinct experts hit when `tokens` tokens each pick k of E experts uniformly:
// E * (1 - (1 - k/E)^tokens), rounded, at least 1 and at most min(E, tokens * k).
int64_t expected_active_experts(int64_t experts, int64_t k, int64_t tokens);
// Note [moe row spread]: the rows per expert under the same uniform routing, Binomial(tokens, k/E),
// as (rows >= 1, E * P(rows)), at most kMaxSpreadPoints entries in increasing rows.
inline constexpr int kMaxSpreadPoints = 32;
std::vector<RowsShare> expert_row_spread(int64_t experts, int64_t k, int64_t tokens);

std::string dims_str(const perfdb::Dims& dims, const std::string& op);  // "tokens=1024 hidden=4096"

}  // namespace opforge::model
