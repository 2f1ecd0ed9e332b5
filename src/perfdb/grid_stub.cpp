// Stand-in for src/perfdb/grid.cpp (the collector's grids and the ops' cost models at a point)
// while that file is absent; CMakeLists.txt leaves this file out of the build once it exists.
#include "opforge/perfdb.h"

namespace opforge::perfdb {

namespace {
[[noreturn]] void missing(const std::string& what) {
  throw Error(ErrorCode::not_available, "perfdb: " + what + " is not available in this build (no op grids)");
}
}  // namespace

const std::vector<OpGrid>& known_ops() {
  static const std::vector<OpGrid> none;
  return none;
}
const OpGrid& op_grid(const std::string& op) { missing("the grid of op '" + op + "'"); }
Case case_at(const std::string& op, const Dims&) { missing("the case of op '" + op + "'"); }
Cost cost_at(const std::string& op, const std::string&, const Dims&) { missing("the cost model of op '" + op + "'"); }

}  // namespace opforge::perfdb
