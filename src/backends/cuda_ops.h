// The ops that have CUDA kernels (ops/<family>/cuda.cu). A build without CUDA registers one `cuda`
// entry, never available, for each of these only (src/backends/without_cuda.cpp), so `opforge list`
// says why their CUDA kernels are missing and claims none for ops that have no CUDA kernel at all.
// tests/cuda_registration_test.cpp keeps this list equal to what a CUDA build registers.
#pragma once

#include <string_view>

namespace opforge {

inline constexpr std::string_view kOpsWithCudaKernels[] = {
    "rms_norm",         "rms_norm_backward",          "fused_add_rms_norm", "fused_add_rms_norm_backward",
    "silu_and_mul",     "silu_and_mul_backward",      "rotary_embedding",   "rotary_embedding_backward",
    "topk_softmax",     "grouped_topk",               "linear",
    "gemma_rms_norm",   "gemma_rms_norm_backward",    "gemma_fused_add_rms_norm",
    "gemma_fused_add_rms_norm_backward",                "gelu_and_mul",       "gelu_and_mul_backward",
    "mul_and_silu",     "mul_and_silu_backward",      "fatrelu_and_mul",    "fatrelu_and_mul_backward",
    "embedding",        "embedding_backward",         "attention_decode",   "attention_prefill",
    "softmax",          "softmax_backward",           "log_softmax",        "log_softmax_backward",
    "cross_entropy",    "cross_entropy_backward",     "cross_entropy_with_grad",
    "layer_norm",       "layer_norm_backward",
    "gelu_new",         "gelu_new_backward",          "gelu_fast",          "gelu_fast_backward",
    "quick_gelu",       "quick_gelu_backward",        "relu2",              "relu2_backward",
    "xielu",            "xielu_backward",             "swigluoai_and_mul",  "swigluoai_and_mul_backward",
    "quant_fp8",
    "kl_div",           "kl_div_backward",            "jsd",                "jsd_backward",
    "tvd",              "tvd_backward",               "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_backward",              "fused_linear_cross_entropy_with_grad",
    "attention_prefill_backward",
    "moe_permute",      "moe_unpermute",
    "all_reduce",
};

}  // namespace opforge
