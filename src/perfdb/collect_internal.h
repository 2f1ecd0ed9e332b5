// Collector internals: energy readings through NVML, loaded at run time (no NVML headers or link
// dependency), and a message helper.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace opforge::perfdb::detail {

// A reader of the cumulative energy counter of CUDA device `index` in millijoules
// (nvmlDeviceGetTotalEnergyConsumption, Volta and newer), or an empty function when
// libnvidia-ml.so.1 cannot be loaded or the device has no counter; `why` then says why.
std::function<double()> nvml_energy_reader(int index, std::string* why);

// "a, b, c" (the collector's messages).
std::string join_names(const std::vector<std::string>& items, const char* sep = ", ");

}  // namespace opforge::perfdb::detail
