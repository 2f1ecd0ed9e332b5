#!/usr/bin/env python3
"""opforge's training-step losses side by side with PyTorch on the same card.

Two shapes of a Llama-3 training step, in bf16 (the harness's `training` case group):
  - cross_entropy forward + backward, 8,192 tokens x vocab 128,256 (mean reduction): opforge's
    cross_entropy then cross_entropy_backward, and opforge's fused cross_entropy_with_grad (loss,
    lse and dlogits in one call, Liger's form), against torch eager and torch.compile of
    F.cross_entropy(logits.float(), target) followed by .backward();
  - fused_linear_cross_entropy forward + backward, 8,192 tokens x 4,096 -> 128,256: opforge's
    fused op and its backward, and fused_linear_cross_entropy_with_grad (both in one call, Liger's
    form), against unfused torch eager: logits = hidden @ w.T (bf16), then
    F.cross_entropy(logits.float(), target) and .backward() (d_hidden and d_w).
opforge: `opforge bench <ops> --backend cuda --dtype bf16 --group training --json` (perf mode,
Note [graph timing]; the fastest CUDA kernel of each op; forward and backward timed separately and
added). torch: CUDA events around `--iters` back-to-back steps after warm-up (milliseconds a step,
so host overhead does not matter), median of `--reps` such runs. torch's extra memory is the peak
allocated during a step above what was allocated before it (extra_peak_bytes); opforge's is
measured by the CudaMembw.FlceExtraMemoryIsMeasuredBelowAnEighthOfTheLogits test (printed there).
Writes a markdown table to --out and prints it. Run on the GPU machine from the repository root
after building build-gpu/. Needs torch with CUDA.
"""
import argparse
import os

import compare_common

TOKENS, HIDDEN, VOCAB = 8192, 4096, 128256
CE_CASE = f"t{TOKENS}xv{VOCAB}"
FLCE_CASE = f"t{TOKENS}_h{HIDDEN}_v{VOCAB}"
OPS = ("cross_entropy", "cross_entropy_backward", "cross_entropy_with_grad", "fused_linear_cross_entropy",
       "fused_linear_cross_entropy_backward", "fused_linear_cross_entropy_with_grad")


def opforge_times(args):
    """{op: (impl, us)} for the training cases (fastest CUDA kernel), copy ceiling, device name."""
    path = os.path.join(args.out_dir, "compare-train-opforge.json")
    doc = compare_common.run_bench(args.opforge, [*OPS, "--backend", "cuda", "--dtype", "bf16", "--group",
                                                      "training", "--no-reference"], path)
    best = {op: v for (op, case), v in compare_common.fastest_cuda(doc).items() if case in (CE_CASE, FLCE_CASE)}
    missing = [op for op in OPS if op not in best]
    if missing:
        raise SystemExit(f"opforge bench gave no time for {missing} (see {path})")
    return best, doc.get("cuda_copy_gbps", 0.0), doc.get("cuda_device", "")


def extra_peak_bytes(torch, step):
    """Peak bytes allocated during one step above what was allocated before it. Before it the
    inputs, weights and the previous step's gradients exist; the step drops those gradients and
    makes new ones of the same size, so the difference is the step's scratch (logits and the like)."""
    step()  # gradients exist from here on, as in a training loop
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def torch_times(torch, args):
    import torch.nn.functional as F
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    target = torch.randint(0, VOCAB, (TOKENS,), device=dev, generator=gen)
    res = {}

    logits = torch.randn(TOKENS, VOCAB, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()

    def ce(lg, t):
        return F.cross_entropy(lg.float(), t)

    compiled = torch.compile(ce)
    for name, fn in (("eager", ce), ("compile", compiled)):
        def step(fn=fn):
            logits.grad = None
            fn(logits, target).backward()
        res[("ce", name)] = compare_common.events_median_ms(torch, step, args.iters, args.reps)
    del logits
    torch.cuda.empty_cache()

    hidden = (0.05 * torch.randn(TOKENS, HIDDEN, device=dev, dtype=torch.bfloat16, generator=gen)).requires_grad_()
    w = (0.02 * torch.randn(VOCAB, HIDDEN, device=dev, dtype=torch.bfloat16, generator=gen)).requires_grad_()

    def unfused():
        hidden.grad = None
        w.grad = None
        F.cross_entropy((hidden @ w.t()).float(), target).backward()

    res[("flce", "eager")] = compare_common.events_median_ms(torch, unfused, max(args.iters // 4, 2), args.reps)
    res[("flce", "extra_bytes")] = extra_peak_bytes(torch, unfused)
    return res, torch.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--opforge", default="build-gpu/bin/opforge")
    ap.add_argument("--out", default="compare-torch-train.md")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import torch
    ours, copy_gbps, device = opforge_times(args)
    theirs, version = torch_times(torch, args)
    ce_us = ours["cross_entropy"][1] + ours["cross_entropy_backward"][1]
    ce_fused_impl, ce_fused_us = ours["cross_entropy_with_grad"]
    fl_us = ours["fused_linear_cross_entropy"][1] + ours["fused_linear_cross_entropy_backward"][1]
    fl_both_impl, fl_both_us = ours["fused_linear_cross_entropy_with_grad"]
    logits_gb = TOKENS * VOCAB * 2 / 1e9
    lines = [
        f"Card: {device or torch.cuda.get_device_name()}; copy ceiling in opforge's run {copy_gbps:.0f} GB/s; "
        f"torch {version}; bf16.",
        "",
        "| step | opforge ms (kernels) | torch eager ms | torch.compile ms | eager / opforge | compile / opforge |",
        "|---|---|---|---|---|---|",
        f"| cross_entropy fwd+bwd, {TOKENS} x {VOCAB} | {ce_us / 1e3:.3f} ({ours['cross_entropy'][0]} "
        f"{ours['cross_entropy'][1] / 1e3:.3f} + {ours['cross_entropy_backward'][0]} "
        f"{ours['cross_entropy_backward'][1] / 1e3:.3f}) | {theirs[('ce', 'eager')]:.3f} | "
        f"{theirs[('ce', 'compile')]:.3f} | {theirs[('ce', 'eager')] * 1e3 / ce_us:.2f}x | "
        f"{theirs[('ce', 'compile')] * 1e3 / ce_us:.2f}x |",
        f"| cross_entropy fwd+bwd fused (cross_entropy_with_grad), {TOKENS} x {VOCAB} | {ce_fused_us / 1e3:.3f} "
        f"({ce_fused_impl}; {2 * logits_gb / (ce_fused_us * 1e-6):.0f} GB/s for the logits read and dlogits written) | "
        f"{theirs[('ce', 'eager')]:.3f} | {theirs[('ce', 'compile')]:.3f} | "
        f"{theirs[('ce', 'eager')] * 1e3 / ce_fused_us:.2f}x | {theirs[('ce', 'compile')] * 1e3 / ce_fused_us:.2f}x |",
        f"| fused_linear_cross_entropy fwd+bwd, {TOKENS} x {HIDDEN} -> {VOCAB} (torch: unfused) | "
        f"{fl_us / 1e3:.3f} ({ours['fused_linear_cross_entropy'][1] / 1e3:.3f} + "
        f"{ours['fused_linear_cross_entropy_backward'][1] / 1e3:.3f}) | {theirs[('flce', 'eager')]:.3f} | - | "
        f"{theirs[('flce', 'eager')] * 1e3 / fl_us:.2f}x | - |",
        f"| fused_linear_cross_entropy fwd+bwd in one call (fused_linear_cross_entropy_with_grad), {TOKENS} x "
        f"{HIDDEN} -> {VOCAB} (torch: unfused) | {fl_both_us / 1e3:.3f} ({fl_both_impl}) | "
        f"{theirs[('flce', 'eager')]:.3f} | - | {theirs[('flce', 'eager')] * 1e3 / fl_both_us:.2f}x | - |",
        "",
        f"torch unfused extra memory during a step: peak {theirs[('flce', 'extra_bytes')] / 1e9:.2f} GB above "
        f"the allocations before it; the bf16 logits are {logits_gb:.2f} GB, 1/8 of them {logits_gb / 8:.3f} GB.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
