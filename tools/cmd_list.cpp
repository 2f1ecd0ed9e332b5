// opforge list [--json]: every op x kernel, availability, and what the policy selects per device.
// opforge explain OP [--device D]: the decision trace.
// opforge support [--out F]: the op x backend matrix as markdown.
// opforge support --model M --system S [...]: whether the perf database answers every op call of
// the model (cmd_estimate.cpp); exit status 1 when one is missing.
#include <fstream>
#include <iostream>
#include <memory>

#include "opforge/error.h"
#include "opforge/harness.h"
#include "opforge/registry.h"
#include "tools/cli.h"

namespace opforge::cli {

void add_list(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("list", "ops, kernels, availability and the kernel the policy selects");
  auto common = std::make_shared<Common>();
  auto json = std::make_shared<bool>(false);
  add_common(*cmd, *common);
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->callback([common, json, &status] {
    const Registry& reg = global_registry();
    Policy p = common->policy();
    std::cout << (*json ? reg.dump_json(p) + "\n" : reg.dump_table(p));
    status = 0;
  });
}

void add_explain(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("explain", "why a kernel is chosen for an op on a device");
  auto common = std::make_shared<Common>();
  auto op = std::make_shared<std::string>();
  auto device = std::make_shared<std::string>("cpu");
  add_common(*cmd, *common);
  cmd->add_option("op", *op, "op name")->required();
  cmd->add_option("--device", *device, "cpu or cuda:N");
  cmd->callback([=, &status] {
    const Registry& reg = global_registry();
    Policy p = common->policy();
    std::cout << reg.decide(reg.op(*op), p, parse_device(*device)).explain();
    status = 0;
  });
}

void add_support(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("support", "the op x backend matrix (markdown); with --model: "
                                             "which op calls of the model the perf database answers");
  auto common = std::make_shared<Common>();
  auto out = std::make_shared<std::string>();
  auto model = std::make_shared<ModelFlags>();
  add_common(*cmd, *common);
  cmd->add_option("--out", *out, "write to this file (e.g. docs/ops.md) instead of stdout");
  add_model_flags(*cmd, *model);
  cmd->callback([=, &status] {
    common->policy();  // validates --ops like every command
    if (!model->model.empty()) {
      status = run_model_support(*model);
      return;
    }
    if (!model->system.empty()) throw Error(ErrorCode::invalid_argument, "support --system: give --model too");
    std::string md = harness::support_markdown(global_registry());
    if (out->empty()) {
      std::cout << md;
    } else {
      std::ofstream f(*out);
      if (!f) throw Error(ErrorCode::io, "cannot write " + *out);
      f << md;
      std::cout << "wrote " << *out << "\n";
    }
    status = 0;
  });
}

}  // namespace opforge::cli
