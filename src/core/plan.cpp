// Decisions noted for the performance database (Note [plan regimes] in opforge/plan.h).
#include "opforge/plan.h"

#include <fmt/format.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/parse_number.h"
#include "opforge/error.h"

namespace opforge::plan {

namespace {

std::atomic<int> g_recordings{0};  // any Recording alive, on any thread
thread_local std::vector<Decision>* t_sink = nullptr;

}  // namespace

void note(const char* key, bool on, double value, double threshold) {
  if (g_recordings.load(std::memory_order_relaxed) == 0 || t_sink == nullptr) return;
  Decision d{key, on, value, threshold};
  std::vector<Decision>& sink = *t_sink;
  int same_key = 0;
  for (const Decision& seen : sink) {
    if (seen.key.rfind(d.key, 0) != 0) continue;
    const std::string rest = seen.key.substr(d.key.size());
    if (!rest.empty() && rest[0] != '.') continue;
    Decision plain = seen;
    plain.key = d.key;
    if (plain == d) return;  // already noted
    ++same_key;
  }
  if (same_key > 0) d.key += "." + std::to_string(same_key + 1);
  sink.push_back(std::move(d));
}

Recording::Recording() {
  if (t_sink != nullptr) throw Error(ErrorCode::internal, "plan::Recording: one is already active on this thread");
  t_sink = new std::vector<Decision>();
  g_recordings.fetch_add(1, std::memory_order_relaxed);
}

Recording::~Recording() {
  g_recordings.fetch_sub(1, std::memory_order_relaxed);
  delete t_sink;
  t_sink = nullptr;
}

std::vector<Decision> Recording::decisions() const { return t_sink ? *t_sink : std::vector<Decision>{}; }

std::string to_text(const std::vector<Decision>& decisions) {
  std::string s;
  for (const Decision& d : decisions)
    s += fmt::format("{}{}{}{}/{}", s.empty() ? "" : ";", d.key, d.on ? '+' : '-', d.value, d.threshold);
  return s;
}

std::vector<Decision> parse(const std::string& text) {
  std::vector<Decision> out;
  auto bad = [&](const std::string& what) -> void {
    throw Error(ErrorCode::parse, fmt::format("plan '{}': {}", text, what));
  };
  auto number = [&](const std::string& s) {
    double v = 0;
    if (!detail::parse_finite_double(s, v)) bad(fmt::format("'{}' is not a finite number", s));
    return v;
  };
  if (!text.empty() && text.back() == ';') bad("it ends in ';'");
  size_t start = 0;
  while (start < text.size()) {
    size_t stop = text.find(';', start);
    if (stop == std::string::npos) stop = text.size();
    const std::string item = text.substr(start, stop - start);
    size_t k = 0;
    while (k < item.size() && (std::islower(static_cast<unsigned char>(item[k])) || item[k] == '_' || item[k] == '.' ||
                               std::isdigit(static_cast<unsigned char>(item[k]))))
      ++k;
    if (k == 0 || k == item.size() || (item[k] != '+' && item[k] != '-'))
      bad(fmt::format("'{}' is not key+value/threshold or key-value/threshold", item));
    const size_t slash = item.find('/', k + 1);
    if (slash == std::string::npos) bad(fmt::format("'{}' has no '/threshold'", item));
    Decision d{item.substr(0, k), item[k] == '+', number(item.substr(k + 1, slash - k - 1)),
               number(item.substr(slash + 1))};
    for (const Decision& seen : out)
      if (seen.key == d.key) bad(fmt::format("key '{}' appears twice", d.key));
    out.push_back(std::move(d));
    start = stop + 1;
  }
  return out;
}

}  // namespace opforge::plan
