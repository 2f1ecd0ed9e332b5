// The one list of op families. Note [explicit registration]: no static initialisers; a family is
// linked in because this function names it.
#include "opforge/registry.h"
#include "ops/activation/activation.h"
#include "ops/layernorm/layernorm.h"
#include "ops/norm/norm.h"

#ifdef OPFORGE_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace opforge {

void register_cuda_placeholders(Registry& reg);  // src/backends/without_cuda.cpp

void register_all(Registry& reg) {
  register_norm(reg);
  register_activation(reg);
  register_layernorm(reg);
#ifdef OPFORGE_WITH_CUDA
  register_cuda_backend(reg);
  register_norm_cuda(reg);
  register_activation_cuda(reg);
#else
  register_cuda_placeholders(reg);
#endif
}

}  // namespace opforge
