// opforge: list, explain, call, check, bench and support over the op registry; perfdb over the
// performance database; estimate and run-layer over the models and the perf database.
#include <cstdio>
#include <exception>
#include <iostream>

#include "opforge/error.h"
#include "tools/cli.h"

int main(int argc, char** argv) {
  CLI::App app{"opforge: LLM operators with several kernels each, a policy that picks one per call, "
               "and a harness that proves and times them"};
  app.require_subcommand(1);
  int status = 0;
  opforge::cli::add_list(app, status);
  opforge::cli::add_explain(app, status);
  opforge::cli::add_call(app, status);
  opforge::cli::add_check(app, status);
  opforge::cli::add_bench(app, status);
  opforge::cli::add_support(app, status);
  opforge::cli::add_perfdb(app, status);
  opforge::cli::add_estimate(app, status);
  opforge::cli::add_run_layer(app, status);
  opforge::cli::add_collect(app, status);
  opforge::cli::add_collect_comm(app, status);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "opforge: error: " << e.what() << " (see opforge --help)\n";
    return 2;
  } catch (const opforge::Error& e) {
    std::cerr << "opforge: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "opforge: error: " << e.what() << "\n";
    return 2;
  }
  return status;
}
