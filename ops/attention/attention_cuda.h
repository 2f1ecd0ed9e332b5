// CUDA kernels of the attention family (ops/attention/cuda.cu, cuda_decode.cu, cuda_prefill.cu),
// declared for registration and for tests that call them directly.
//   attention_prefill_cuda_wmma  tensor-core flash-style tiles; predicate: bf16 / f16, head_dim 64
//                          or 128, 16-byte aligned rows and row strides, enough shared memory
//   attention_prefill_cuda_wmma_async  (impl cuda_wmma2) the same, double-buffered cp.async K/V
//   attention_prefill_cuda one warp per (query, head); predicate: f32 / f16 / bf16
//   attention_prefill_backward_cuda_wmma  (cuda_prefill_backward.cu) tensor-core dq and dk/dv
//                          tiles; predicate as attention_prefill_cuda_wmma (all of q, k, v, dout,
//                          dq, dk, dv)
//   attention_prefill_backward_cuda  (cuda_prefill_backward.cu) warp per query row / key row;
//                          predicate: f32 / f16 / bf16
//   attention_decode_cuda_split  (impl cuda_split, cuda_decode.cu) split-KV decoding with 16-byte
//                          K/V loads; predicate: f16 / bf16, head_dim % 8 == 0 and <= 256, 16-byte
//                          aligned rows and row strides of q / k_cache / v_cache, at most 8 query
//                          heads per kv head
//   attention_decode_cuda_split_async  (impl cuda_split_async) the same with a cp.async ring of
//                          K/V tiles in shared memory; predicate as cuda_split
//   attention_prefill_cudnn, attention_prefill_backward_cudnn  (impl cudnn, cuda_prefill_cudnn.cu)
//                          cuDNN's fused attention (SDPA graphs, libcudnn loaded at run time);
//                          predicate: bf16 / f16, head_dim % 8 == 0 and <= 256, 16-byte aligned
//                          rows, contiguous lse, and a graph cuDNN accepts for the shape. Registered
//                          only when built with cuDNN's headers (CMake OPFORGE_CUDNN)
//   attention_decode_cuda  split-K decoding with GQA sharing; predicate: dtype, head_dim <= 256,
//                          at most 8 query heads per kv head
#pragma once

#include "ops/attention/attention.h"

namespace opforge {

void attention_decode_cuda(const Context&, const TensorView& out, const TensorView& q,
                           const TensorView& k_cache, const TensorView& v_cache,
                           const TensorView& seq_lens, double softmax_scale);
const char* attention_decode_cuda_applicable(const TensorView& out, const TensorView& q,
                                             const TensorView& k_cache, const TensorView& v_cache,
                                             const TensorView& seq_lens, double softmax_scale);

void attention_decode_cuda_split(const Context&, const TensorView& out, const TensorView& q,
                                 const TensorView& k_cache, const TensorView& v_cache,
                                 const TensorView& seq_lens, double softmax_scale);
const char* attention_decode_cuda_split_applicable(const TensorView& out, const TensorView& q,
                                                   const TensorView& k_cache,
                                                   const TensorView& v_cache,
                                                   const TensorView& seq_lens, double softmax_scale);
void attention_decode_cuda_split_async(const Context&, const TensorView& out,
                                       const TensorView& q, const TensorView& k_cache,
                                       const TensorView& v_cache, const TensorView& seq_lens,
                                       double softmax_scale);  // same predicate as cuda_split
// impl cuda_split_mma (cuda_decode_mma.cu): split-KV decoding on tensor cores; predicate: f16 /
// bf16, head_dim 64 or 128, at most 16 query heads per kv head, aligned rows as cuda_split
void attention_decode_cuda_split_mma(const Context&, const TensorView& out, const TensorView& q,
                                     const TensorView& k_cache, const TensorView& v_cache,
                                     const TensorView& seq_lens, double softmax_scale);
const char* attention_decode_cuda_split_mma_applicable(const TensorView& out, const TensorView& q,
                                                       const TensorView& k_cache,
                                                       const TensorView& v_cache,
                                                       const TensorView& seq_lens,
                                                       double softmax_scale);
void register_attention_decode_split_cuda(Registry& reg);  // cuda_decode.cu: the three split impls

void attention_prefill_cuda(const Context&, const TensorView& out, const TensorView& lse,
                            const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& cu_seqlens, bool causal, double softmax_scale,
                            int64_t window_left);
const char* attention_prefill_cuda_applicable(const TensorView& out, const TensorView& lse,
                                              const TensorView& q, const TensorView& k,
                                              const TensorView& v, const TensorView& cu_seqlens,
                                              bool causal, double softmax_scale, int64_t window_left);
void attention_prefill_cuda_wmma(const Context&, const TensorView& out, const TensorView& lse,
                                 const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& cu_seqlens, bool causal, double softmax_scale,
                                 int64_t window_left);
const char* attention_prefill_cuda_wmma_applicable(const TensorView& out, const TensorView& lse,
                                                   const TensorView& q, const TensorView& k,
                                                   const TensorView& v, const TensorView& cu_seqlens,
                                                   bool causal, double softmax_scale,
                                                   int64_t window_left);
void attention_prefill_cuda_wmma_async(const Context&, const TensorView& out,
                                       const TensorView& lse, const TensorView& q,
                                       const TensorView& k, const TensorView& v,
                                       const TensorView& cu_seqlens, bool causal,
                                       double softmax_scale, int64_t window_left);
const char* attention_prefill_cuda_wmma_async_applicable(
    const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
    const TensorView& v, const TensorView& cu_seqlens, bool causal, double softmax_scale,
    int64_t window_left);
void register_attention_prefill_cuda(Registry& reg);  // cuda_prefill.cu

void attention_prefill_backward_cuda(const Context&, const TensorView& dq, const TensorView& dk,
                                     const TensorView& dv, const TensorView& dout,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& lse,
                                     const TensorView& cu_seqlens, bool causal,
                                     double softmax_scale, int64_t window_left);
const char* attention_prefill_backward_cuda_applicable(
    const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
    const TensorView& lse, const TensorView& cu_seqlens, bool causal, double softmax_scale,
    int64_t window_left);
void attention_prefill_backward_cuda_wmma(const Context&, const TensorView& dq,
                                          const TensorView& dk, const TensorView& dv,
                                          const TensorView& dout, const TensorView& q,
                                          const TensorView& k, const TensorView& v,
                                          const TensorView& out, const TensorView& lse,
                                          const TensorView& cu_seqlens, bool causal,
                                          double softmax_scale, int64_t window_left);
const char* attention_prefill_backward_cuda_wmma_applicable(
    const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
    const TensorView& lse, const TensorView& cu_seqlens, bool causal, double softmax_scale,
    int64_t window_left);
void register_attention_prefill_backward_cuda(Registry& reg);  // cuda_prefill_backward.cu

void attention_prefill_cudnn(const Context&, const TensorView& out, const TensorView& lse,
                             const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& cu_seqlens, bool causal, double softmax_scale,
                             int64_t window_left);
const char* attention_prefill_cudnn_applicable(const TensorView& out, const TensorView& lse,
                                               const TensorView& q, const TensorView& k,
                                               const TensorView& v, const TensorView& cu_seqlens,
                                               bool causal, double softmax_scale, int64_t window_left);
void attention_prefill_backward_cudnn(const Context&, const TensorView& dq, const TensorView& dk,
                                      const TensorView& dv, const TensorView& dout,
                                      const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse,
                                      const TensorView& cu_seqlens, bool causal,
                                      double softmax_scale, int64_t window_left);
const char* attention_prefill_backward_cudnn_applicable(
    const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
    const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
    const TensorView& lse, const TensorView& cu_seqlens, bool causal, double softmax_scale,
    int64_t window_left);
// cuda_prefill_cudnn.cu: both cudnn impls; registers nothing when built without cuDNN
void register_attention_prefill_cudnn(Registry& reg);

void register_attention_cuda(Registry& reg);  // all of the family's CUDA kernels

}  // namespace opforge
