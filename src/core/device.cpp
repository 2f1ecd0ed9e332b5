#include "opforge/device.h"

#include <charconv>
#include <string>

#include "opforge/error.h"

namespace opforge {

const char* device_kind_name(DeviceKind k) { return k == DeviceKind::cpu ? "cpu" : "cuda"; }

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view num = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && end == num.data() + num.size() && index >= 0 && !num.empty())
      return Device::cuda(index);
  }
  throw Error(ErrorCode::unknown_name,
              "unknown device '" + std::string(text) + "'; valid: cpu, cuda, cuda:N");
}

}  // namespace opforge
