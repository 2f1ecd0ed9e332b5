// The one list of op families. Note [explicit registration]: no static initialisers; a family is
// linked in because this function names it.
#include "opforge/registry.h"
#include "ops/activation/activation.h"
#include "ops/comm/comm.h"
#include "ops/embedding/embedding.h"
#include "ops/linear/linear.h"
#include "ops/attention/attention.h"
#include "ops/layernorm/layernorm.h"
#include "ops/norm/norm.h"
#include "ops/quant/quant.h"
#include "ops/rotary/rotary.h"
#include "ops/routing/routing.h"
#include "ops/softmax/softmax.h"
#include "ops/loss/loss.h"

#ifdef OPFORGE_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#include "ops/activation/activation_pointwise_cuda.h"
#include "ops/attention/attention_cuda.h"
#include "ops/comm/comm_cuda.h"
#include "ops/embedding/embedding_cuda.h"
#include "ops/layernorm/layernorm_cuda.h"
#include "ops/linear/linear_cuda.h"
#include "ops/quant/quant_cuda.h"
#include "ops/rotary/rotary_cuda.h"
#include "ops/routing/routing_cuda.h"
#include "ops/softmax/softmax_cuda.h"
#include "ops/loss/loss_cuda.h"
#endif

namespace opforge {

void register_cuda_placeholders(Registry& reg);  // src/backends/without_cuda.cpp

void register_all(Registry& reg) {
  register_norm(reg);
  register_activation(reg);
  register_rotary(reg);
  register_routing(reg);
  register_quant(reg);
  register_softmax(reg);
  register_loss(reg);
  register_linear(reg);
  register_embedding(reg);
  register_attention(reg);
  register_layernorm(reg);
  register_comm(reg);
#ifdef OPFORGE_WITH_CUDA
  register_cuda_backend(reg);
  register_norm_cuda(reg);
  register_activation_cuda(reg);
  register_rotary_cuda(reg);
  register_routing_cuda(reg);
  register_softmax_cuda(reg);
  register_loss_cuda(reg);
  register_linear_cuda(reg);
  register_embedding_cuda(reg);
  register_attention_cuda(reg);
  register_layernorm_cuda(reg);
  register_activation_pointwise_cuda(reg);
  register_quant_cuda(reg);
  register_comm_cuda(reg);
#else
  register_cuda_placeholders(reg);
#endif
}

}  // namespace opforge
