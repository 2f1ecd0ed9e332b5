// NCCL's entry points, bound at run time (nccl.cuh).
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "backends/cuda/nccl.cuh"
#include "opforge/error.h"

namespace opforge::cuda::nccl {

namespace {

constexpr int kFloat16 = 6, kFloat32 = 7, kBfloat16 = 9;  // ncclDataType_t

template <class F> bool bind(Api& n, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(n.handle, name));
  if (!fn) n.error = std::string("symbol ") + name + " missing from the NCCL library";
  return fn != nullptr;
}

}  // namespace

const Api& api() {
  static const Api loaded = [] {
    Api n;
    const char* env = std::getenv("OPFORGE_NCCL_LIBRARY");
    std::string path = env && *env ? env : "libnccl.so.2";
    n.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!n.handle) {
      const char* why = dlerror();
      n.error = "NCCL could not be loaded (" + path + "): " + (why ? why : "unknown reason") +
                "; set OPFORGE_NCCL_LIBRARY to libnccl.so.2's path";
      return n;
    }
    if (bind(n, n.get_version, "ncclGetVersion") && bind(n, n.comm_init_all, "ncclCommInitAll") &&
        bind(n, n.comm_destroy, "ncclCommDestroy") && bind(n, n.all_reduce, "ncclAllReduce") &&
        bind(n, n.group_start, "ncclGroupStart") && bind(n, n.group_end, "ncclGroupEnd") &&
        bind(n, n.error_string, "ncclGetErrorString")) {
      n.get_version(&n.version);
    }
    return n;
  }();
  return loaded;
}

void check_result(int result, const char* what) {
  if (result != 0)
    throw Error(ErrorCode::backend, std::string(what) + " failed: " + api().error_string(result));
}

int dtype_code(DType t, const char* op) {
  switch (t) {
    case DType::bf16: return kBfloat16;
    case DType::f16: return kFloat16;
    case DType::f32: return kFloat32;
    default:
      throw Error(ErrorCode::invalid_argument,
                  std::string(op) + ": argument 'dtype': expected bf16, f16 or f32, got " + dtype_name(t));
  }
}

std::string describe() {
  const Api& n = api();
  if (!n.error.empty()) return n.error;
  return "NCCL " + std::to_string(n.version / 10000) + "." + std::to_string(n.version / 100 % 100) + "." +
         std::to_string(n.version % 100);
}

}  // namespace opforge::cuda::nccl
