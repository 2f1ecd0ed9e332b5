// Reading numbers out of text files (perf tables, plans): a whole field, nothing else.
#pragma once

#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

namespace opforge::detail {

// True when every character of `s` is one finite double (strtod's syntax, no leading space, no
// overflow), which is then stored in v.
inline bool parse_finite_double(const std::string& s, double& v) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front()))) return false;
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(parsed)) return false;
  v = parsed;
  return true;
}

}  // namespace opforge::detail
