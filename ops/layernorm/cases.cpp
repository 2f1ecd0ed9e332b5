// Harness cases of the layernorm family (see Case in opforge/op.h).
//
// layer_norm and dyt (row ops): small, medium (16 x 4096), large model shapes (hidden 4096,
// tokens 1 / 16 / 1024 / 16384), and edge cases: no rows, one element, sizes that are not a
// multiple of any vector width, a 3-d input, padded rows on inputs and outputs, rows whose mean
// is far from 0 (Note [centred sums] in cpu.cpp), the optional bias left out,
// for the forward ops the in-place form (y over x); layer_norm adds 16 x 2048 (a one-warp row of
// its CUDA kernel) and layer_norm_backward 1600 x 4096 (several rows per block of its CUDA
// kernel), 2400 x 2048 and 2400 x 1000 under a large mean (its CUDA bulk-copy pipeline) to the
// edge group.
// group_norm ([N, C, *], contiguous): small, medium, large (C = 512, 32 groups, 1024 / 4096
// positions), edge cases (no batch, one element, no positions, one channel per group, odd sizes,
// a 4-d input, in place).
// Weights and gamma are U(0.5, 1.5), biases N(0, 1), activations N(0, 1) with outliers, alpha
// U(0.3, 1.2) (DyT initialises it to 0.5).
#include <string>
#include <utility>

#include "ops/layernorm/internal.h"

namespace opforge {

namespace {

TensorInit tensor(const Shape& shape, Fill fill = Fill::normal_outliers, int64_t row_pad = 0) {
  TensorInit t;
  t.shape = shape;
  t.fill = fill;
  t.row_pad = row_pad;
  return t;
}

TensorInit uniform(const Shape& shape, double low, double high) {
  TensorInit t = tensor(shape, Fill::uniform);
  t.low = low;
  t.high = high;
  return t;
}

// ---- row ops: layer_norm, dyt and their backward ops ------------------------------------------
struct RowSpec {
  std::vector<const char*> row_inputs;   // {"x"} or {"dy", "x"}
  std::vector<const char*> row_outputs;  // listed only when a case pads them
  // Parameter vectors: (name, fill). hidden long, except "alpha" ([1]).
  std::vector<std::pair<const char*, Fill>> params;
  const char* optional_param = nullptr;  // left out where a case says so
  std::vector<std::pair<const char*, Value>> scalars;
  bool in_place = false;  // forward: y over x
};

struct RowLayout {
  int64_t input_pad = 0, output_pad = 0;
  bool without_optional = false;
  bool shifted_mean = false;  // x ~ U(100, 104): rows with a mean far from 0
};

Case row_case(const RowSpec& spec, std::string label, CaseGroup group, const Shape& shape,
              RowLayout layout = {}) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  const int64_t hidden = shape[shape.ndim - 1];
  for (const char* name : spec.row_inputs) {
    TensorInit t = layout.shifted_mean && std::string(name) == "x" ? uniform(shape, 100, 104)
                                                                   : tensor(shape);
    t.row_pad = layout.input_pad;
    c.args.push_back({name, t});
  }
  for (const auto& [name, fill] : spec.params) {
    if (layout.without_optional && spec.optional_param && std::string(name) == spec.optional_param)
      continue;
    if (std::string(name) == "alpha") c.args.push_back({name, uniform(Shape{1}, 0.3, 1.2)});
    else c.args.push_back({name, tensor(Shape{hidden}, fill)});
  }
  if (layout.output_pad > 0)
    for (const char* name : spec.row_outputs) c.args.push_back({name, tensor(shape, Fill::normal, layout.output_pad)});
  for (const auto& [name, value] : spec.scalars) c.args.push_back({name, value});
  return c;
}

std::vector<Case> row_cases(const RowSpec& spec) {
  std::vector<Case> cases;
  // A case leaving the optional parameter out says so in its label ("_no_b").
  auto add = [&](std::string label, CaseGroup group, Shape shape, RowLayout layout = {}) {
    if (layout.without_optional && spec.optional_param) label += std::string("_no_") + spec.optional_param;
    cases.push_back(row_case(spec, std::move(label), group, shape, layout));
  };
  const RowLayout no_opt{0, 0, true};
  add("4x64", CaseGroup::small, {4, 64});
  add("7x33", CaseGroup::small, {7, 33});
  if (spec.optional_param) add("7x33", CaseGroup::small, {7, 33}, no_opt);
  add("16x4096", CaseGroup::medium, {16, 4096});
  if (spec.optional_param) add("16x4096", CaseGroup::medium, {16, 4096}, no_opt);
  for (int64_t tokens : {1, 16, 1024, 16384})
    add("t" + std::to_string(tokens) + "xh4096", CaseGroup::large, {tokens, 4096});
  add("0x64", CaseGroup::edge, {0, 64});
  add("1x1", CaseGroup::edge, {1, 1});
  add("3x67", CaseGroup::edge, {3, 67});
  add("5x4097", CaseGroup::edge, {5, 4097});
  add("2x3x40", CaseGroup::edge, {2, 3, 40});
  add("5x67_inputs_pad8", CaseGroup::edge, {5, 67}, {8, 0});
  add("5x67_outputs_pad5", CaseGroup::edge, {5, 67}, {0, 5, true});
  add("3x4097_all_pad3", CaseGroup::edge, {3, 4097}, {3, 3});
  add("4x1000_mean_100", CaseGroup::edge, {4, 1000}, {0, 0, false, true});
  // Few rows of two other shapes (16 x 8192, 48 x 1024) and a row of 513 bf16 packs under a
  // large mean (9 x 4104).
  add("16x8192", CaseGroup::edge, {16, 8192});
  add("48x1024", CaseGroup::edge, {48, 1024});
  add("9x4104_mean_100", CaseGroup::edge, {9, 4104}, {0, 0, false, true});
  if (spec.in_place) {
    add("7x33_in_place", CaseGroup::edge, {7, 33});
    cases.back().in_place = {{"y", "x"}};
    add("16x4096_in_place_pad8", CaseGroup::edge, {16, 4096}, {8, 0});
    cases.back().in_place = {{"y", "x"}};
  }
  return cases;
}

const Value kEps = Value(1e-5);

// ---- group_norm ----------------------------------------------------------------------------------
Case group_case(bool backward, std::string label, CaseGroup group, const Shape& shape,
                int64_t num_groups) {
  Case c;
  c.label = std::move(label);
  c.group = group;
  if (backward) c.args.push_back({"dy", tensor(shape)});
  c.args.push_back({"x", tensor(shape)});
  c.args.push_back({"w", tensor(Shape{shape[1]}, Fill::uniform_positive)});
  if (!backward) c.args.push_back({"b", tensor(Shape{shape[1]}, Fill::normal)});
  c.args.push_back({"num_groups", Value(num_groups)});
  c.args.push_back({"eps", kEps});
  return c;
}

std::vector<Case> group_cases(bool backward) {
  std::vector<Case> cases;
  auto add = [&](std::string label, CaseGroup group, Shape shape, int64_t num_groups) {
    cases.push_back(group_case(backward, std::move(label), group, shape, num_groups));
  };
  add("2x8x16_g4", CaseGroup::small, {2, 8, 16}, 4);
  add("3x6x5x7_g3", CaseGroup::small, {3, 6, 5, 7}, 3);
  add("4x128x512_g32", CaseGroup::medium, {4, 128, 512}, 32);
  add("8x512x1024_g32", CaseGroup::large, {8, 512, 1024}, 32);
  add("16x512x4096_g32", CaseGroup::large, {16, 512, 4096}, 32);
  add("0x8x4_g2", CaseGroup::edge, {0, 8, 4}, 2);
  add("1x1_g1", CaseGroup::edge, {1, 1}, 1);
  add("2x6x0_g3", CaseGroup::edge, {2, 6, 0}, 3);
  add("2x32x9_g32", CaseGroup::edge, {2, 32, 9}, 32);
  // Groups of one element (first found by check --fuzz): dx must be 0, not rstd times rounding.
  add("2x131x1_g131", CaseGroup::edge, {2, 131, 1}, 131);
  add("3x10x67_g5", CaseGroup::edge, {3, 10, 67}, 5);
  add("2x4x4097_g2", CaseGroup::edge, {2, 4, 4097}, 2);
  add("5x12_g4", CaseGroup::edge, {5, 12}, 4);
  if (!backward) {
    add("2x8x33_g4_in_place", CaseGroup::edge, {2, 8, 33}, 4);
    cases.back().in_place = {{"y", "x"}};
  }
  return cases;
}

}  // namespace

std::vector<Case> layer_norm_cases() {
  const RowSpec spec{{"x"}, {"y"}, {{"w", Fill::uniform_positive}, {"b", Fill::normal}}, "b",
                     {{"eps", kEps}}, true};
  std::vector<Case> cases = row_cases(spec);
  // A row that one warp holds in the CUDA cuda_vec16_rowblock kernel (bf16: 32 threads x 8 packs),
  // with enough rows (>= 128) for that kernel to take the call.
  cases.push_back(row_case(spec, "256x2048_one_warp_row", CaseGroup::edge, {256, 2048}));
  return cases;
}

std::vector<Case> layer_norm_backward_cases() {
  const RowSpec spec{{"dy", "x"}, {"dx"}, {{"w", Fill::uniform_positive}}, nullptr, {{"eps", kEps}}};
  std::vector<Case> cases = row_cases(spec);
  // More rows than a GPU holds blocks of the CUDA cuda_vec16_async kernel at once, so each block
  // runs several rows through its shared-memory row pipeline (test mode skips the large group).
  cases.push_back(row_case(spec, "1600x4096_rows_per_block", CaseGroup::edge, {1600, 4096}));
  // Enough rows (18 an SM on an H100 / H200) for its bulk-copy pipeline in 16-bit types (Note
  // [layer_norm backward in one reduction]; f32 takes it from 4 to 16 rows an SM, as in the 1600 x
  // 4096 case), whose statistics shift by each row's first element: plain rows, and rows with a
  // mean far from 0.
  cases.push_back(row_case(spec, "2400x2048_bulk_rows", CaseGroup::edge, {2400, 2048}));
  cases.push_back(row_case(spec, "2400x1000_mean_100_bulk_rows", CaseGroup::edge, {2400, 1000},
                           {0, 0, false, true}));
  // At least as many rows as SMs, and enough for the bulk pipeline, whose dw it then sums by
  // columns (Note [column dw]): 125 bf16 packs a row, under a large mean.
  cases.push_back(row_case(spec, "133x1000", CaseGroup::edge, {133, 1000}));
  cases.push_back(row_case(spec, "600x1000_mean_100", CaseGroup::edge, {600, 1000}, {0, 0, false, true}));
  return cases;
}

std::vector<Case> group_norm_cases() { return group_cases(false); }
std::vector<Case> group_norm_backward_cases() { return group_cases(true); }

std::vector<Case> dyt_cases() {
  return row_cases({{"x"},
                    {"y"},
                    {{"alpha", Fill::uniform}, {"gamma", Fill::uniform_positive}, {"beta", Fill::normal}},
                    "beta",
                    {},
                    true});
}

std::vector<Case> dyt_backward_cases() {
  return row_cases({{"dy", "x"}, {"dx"}, {{"alpha", Fill::uniform}, {"gamma", Fill::uniform_positive}}, nullptr, {}});
}

}  // namespace opforge
