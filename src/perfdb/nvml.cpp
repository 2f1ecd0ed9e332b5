// NVML through dlopen: the few entry points the collector needs, with their C signatures written
// out here (NVML's ABI: nvmlReturn_t is an int, 0 = success; nvmlDevice_t an opaque pointer).
// Note: the index NVML counts devices by is the PCI order, while CUDA's default order is "fastest
// first"; with CUDA_DEVICE_ORDER=PCI_BUS_ID (or one visible device) they agree.
#include "perfdb/collect_internal.h"

#include <dlfcn.h>

#include <mutex>

namespace opforge::perfdb::detail {

namespace {

using nvmlReturn = int;
using nvmlDevice = void*;
using InitFn = nvmlReturn (*)();
using HandleFn = nvmlReturn (*)(unsigned int, nvmlDevice*);
using EnergyFn = nvmlReturn (*)(nvmlDevice, unsigned long long*);  // millijoules since driver load
using ErrorStringFn = const char* (*)(nvmlReturn);

struct Nvml {
  void* lib = nullptr;
  InitFn init = nullptr;
  HandleFn handle = nullptr;
  EnergyFn energy = nullptr;
  ErrorStringFn error_string = nullptr;
  std::string why;
  bool ok = false;
};

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!n.lib) {
      const char* e = dlerror();
      n.why = std::string("libnvidia-ml.so.1 not loadable: ") + (e ? e : "unknown");
      return;
    }
    n.init = reinterpret_cast<InitFn>(dlsym(n.lib, "nvmlInit_v2"));
    n.handle = reinterpret_cast<HandleFn>(dlsym(n.lib, "nvmlDeviceGetHandleByIndex_v2"));
    n.energy = reinterpret_cast<EnergyFn>(dlsym(n.lib, "nvmlDeviceGetTotalEnergyConsumption"));
    n.error_string = reinterpret_cast<ErrorStringFn>(dlsym(n.lib, "nvmlErrorString"));
    if (!n.init || !n.handle || !n.energy) {
      n.why = "libnvidia-ml.so.1 lacks nvmlInit_v2 / nvmlDeviceGetHandleByIndex_v2 / "
              "nvmlDeviceGetTotalEnergyConsumption";
      return;
    }
    if (nvmlReturn r = n.init(); r != 0) {
      n.why = std::string("nvmlInit failed: ") + (n.error_string ? n.error_string(r) : std::to_string(r));
      return;
    }
    n.ok = true;
  });
  return n;
}

}  // namespace

std::function<double()> nvml_energy_reader(int index, std::string* why) {
  const Nvml& n = nvml();
  if (!n.ok) {
    if (why) *why = n.why;
    return {};
  }
  nvmlDevice dev = nullptr;
  if (nvmlReturn r = n.handle(unsigned(index), &dev); r != 0) {
    if (why) *why = "no NVML device " + std::to_string(index) + ": " + (n.error_string ? n.error_string(r) : std::to_string(r));
    return {};
  }
  unsigned long long mj = 0;
  if (nvmlReturn r = n.energy(dev, &mj); r != 0) {
    if (why) *why = std::string("no energy counter: ") + (n.error_string ? n.error_string(r) : std::to_string(r));
    return {};
  }
  EnergyFn energy = n.energy;
  return [energy, dev]() -> double {
    unsigned long long v = 0;
    return energy(dev, &v) == 0 ? double(v) : -1.0;
  };
}

}  // namespace opforge::perfdb::detail
