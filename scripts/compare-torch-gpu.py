#!/usr/bin/env python3
"""opforge's CUDA kernels side by side with PyTorch (eager and torch.compile) on the same card.

For rms_norm, fused_add_rms_norm, layer_norm (hidden 4096), silu_and_mul, gelu_and_mul (erf),
gelu_new (intermediate 14336) at 16 / 1024 / 16384 tokens, rotary_embedding (NeoX, 32 + 8 heads x
128, in place) and topk_softmax (128 experts, k = 8, renormalized) at 1024 / 16384 tokens, and
cross_entropy forward (mean) at 16 / 1024 tokens x vocab 32000 / 128256, in bf16:
  - opforge: `opforge bench <ops> --backend cuda --dtype bf16 --group large --json` (perf mode:
    Note [graph timing] in src/backends/cuda/cuda_backend.cu: 20 calls captured in a CUDA graph,
    the median over replays timed with CUDA events), or an existing bench JSON (--bench-json);
    the fastest CUDA kernel of each case is shown;
  - torch eager and torch.compile of the same math, timed the same way: 20 calls captured in a
    torch.cuda.CUDAGraph, median of many replays between CUDA events, divided by 20. A second
    table gives torch timed without a graph (events around 20 back-to-back calls), where host
    overhead shows at small sizes.
Writes a markdown table (µs and ratios) to --out and prints it.

Run on the GPU machine from the repository root after building build-gpu/ (scripts/gpu-check.sh
does both). Needs torch with CUDA.
"""
import argparse
import os
import statistics
import subprocess
import sys

import compare_common

BATCH = 20
TOKENS = (16, 1024, 16384)
HIDDEN = 4096
INTER = 14336
EPS = 1e-6
LN_EPS = 1e-5
OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "silu_and_mul", "gelu_and_mul", "gelu_new",
       "rotary_embedding", "topk_softmax", "cross_entropy")
ROPE_HEADS = (32, 8, 128)  # query heads, key heads, head size (Llama-3.1-8B)
ROPE_MAX_POS = 16384       # cos_sin_cache rows of opforge's large rotary cases
EXPERTS, TOPK = 128, 8
VOCABS = (32000, 128256)


def cases(ops=OPS):
    """(op, tokens, width, opforge case label) in table order."""
    out = []
    for op in ops:
        if op == "cross_entropy":
            out += [(op, t, v, f"t{t}xv{v}") for v in VOCABS for t in (16, 1024)]
        elif op == "rotary_embedding":
            out += [(op, t, 0, f"t{t}_q32_kv8_h128") for t in (1024, 16384)]
        elif op == "topk_softmax":
            out += [(op, t, EXPERTS, f"t{t}_e128_k8") for t in (1024, 16384)]
        elif op in ("silu_and_mul", "gelu_and_mul", "gelu_new"):
            out += [(op, t, INTER, f"t{t}xi{INTER}") for t in TOKENS]
        else:
            out += [(op, t, HIDDEN, f"t{t}xh{HIDDEN}") for t in TOKENS]
    return out


def opforge_times(args):
    """{(op, case label): (impl, us)} from opforge's bench JSON (fastest CUDA kernel of each case)."""
    path = args.bench_json
    if not path:
        path = os.path.join(args.out_dir, "compare-opforge-bench.json")
        doc = compare_common.run_bench(args.opforge, [*args.ops, "--backend", "cuda", "--dtype", "bf16", "--group",
                                                          "large"], path)
    else:
        doc = compare_common.load(path)
    best = compare_common.fastest_cuda(doc)  # keys like (op, "t1024xh4096")
    return best, doc.get("cuda_copy_gbps", 0.0), doc.get("cuda_device", "")


def torch_cases(torch):
    F = torch.nn.functional

    def rms_norm_eager(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, EPS)

    def rms_norm_math(x, w):  # vLLM's formulation, for torch.compile
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        return (xf * torch.rsqrt(var + EPS)).to(x.dtype) * w

    def fused_eager(x, r, w):
        s = x + r
        return F.rms_norm(s, (s.shape[-1],), w, EPS), s

    def fused_math(x, r, w):
        s = x + r
        sf = s.float()
        var = sf.pow(2).mean(-1, keepdim=True)
        return (sf * torch.rsqrt(var + EPS)).to(x.dtype) * w, s

    def silu_and_mul(x):
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)

    def gelu_and_mul(x):
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d]) * x[..., d:]

    def gelu_new(x):
        return F.gelu(x, approximate="tanh")

    def cross_entropy(logits, target):
        return F.cross_entropy(logits.float(), target)

    def rotary_neox(positions, q, k, cache):  # vLLM's native NeoX forward, in place on q and k
        nq, nk, hs = ROPE_HEADS
        cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
        for t, n in ((q, nq), (k, nk)):
            x = t.view(-1, n, hs).float()
            x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
            t.view(-1, n, hs).copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
        return q, k

    def topk_softmax(logits):  # softmax, top-k, renormalize; f32 weights, i32 ids
        w, ids = torch.topk(torch.softmax(logits.float(), dim=-1), TOPK, dim=-1)
        return w / w.sum(dim=-1, keepdim=True), ids.to(torch.int32)

    def make(op, tokens, width):
        g = torch.Generator(device="cuda").manual_seed(tokens)
        dev, bf16 = "cuda", torch.bfloat16
        if op == "rotary_embedding":
            nq, nk, hs = ROPE_HEADS
            pos = torch.randint(0, ROPE_MAX_POS, (tokens,), device=dev, generator=g)
            q = torch.randn(tokens, nq * hs, device=dev, dtype=bf16, generator=g)
            k = torch.randn(tokens, nk * hs, device=dev, dtype=bf16, generator=g)
            cache = torch.randn(ROPE_MAX_POS, hs, device=dev, dtype=bf16, generator=g)
            nbytes = 2 * tokens * (nq + nk) * hs * 2 + tokens * 8 + tokens * hs * 2
            return (pos, q, k, cache), rotary_neox, rotary_neox, nbytes
        if op == "topk_softmax":
            logits = torch.randn(tokens, width, device=dev, dtype=bf16, generator=g)
            return (logits,), topk_softmax, topk_softmax, tokens * width * 2 + tokens * TOPK * 8
        if op in ("silu_and_mul", "gelu_and_mul"):
            x = torch.randn(tokens, 2 * width, device=dev, dtype=bf16, generator=g)
            fn = silu_and_mul if op == "silu_and_mul" else gelu_and_mul
            return (x,), fn, fn, 3 * tokens * width * 2
        if op == "gelu_new":
            x = torch.randn(tokens, width, device=dev, dtype=bf16, generator=g)
            return (x,), gelu_new, gelu_new, 2 * tokens * width * 2
        if op == "cross_entropy":
            logits = torch.randn(tokens, width, device=dev, dtype=bf16, generator=g)
            target = torch.randint(0, width, (tokens,), device=dev, generator=g)
            return (logits, target), cross_entropy, cross_entropy, tokens * width * 2 + tokens * 8 + 4
        x = torch.randn(tokens, width, device=dev, dtype=bf16, generator=g)
        w = torch.rand(width, device=dev, dtype=bf16, generator=g) + 0.5
        if op == "rms_norm":
            return (x, w), rms_norm_eager, rms_norm_math, 2 * tokens * width * 2 + width * 2
        if op == "layer_norm":
            b = torch.randn(width, device=dev, dtype=bf16, generator=g)
            return (x, w, b), layer_norm, layer_norm, 2 * tokens * width * 2 + 2 * width * 2
        r = torch.randn(tokens, width, device=dev, dtype=bf16, generator=g)
        return (x, r, w), fused_eager, fused_math, 4 * tokens * width * 2 + width * 2

    return make


def time_graph_us(torch, fn, args, reps):
    """Median µs per call: BATCH calls captured in a CUDA graph, replays timed with events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(BATCH):
            fn(*args)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1000.0 / BATCH)
    return statistics.median(samples)


def time_stream_us(torch, fn, args, reps):
    """Median µs per call: events around BATCH back-to-back calls (host overhead included)."""
    return compare_common.events_median_ms(torch, lambda: fn(*args), BATCH, reps) * 1000.0


def opforge_attention(args):
    """{(op, key): (impl, us)} from `opforge collect` rows of Llama-3.1-8B's attention at TP 1 (the
    collector times any shape of an op's grid, cold operands; Note [cold operands]): prefill at
    8192 tokens, decode at batch 32 / 256 with a 2048-token context. The fastest impl per point."""
    root = os.path.join(args.out_dir, "compare-attention-perf")
    best = {}
    for op in ("attention_prefill", "attention_decode"):
        for impl in (args.prefill_impls if op == "attention_prefill" else args.decode_impls).split():
            # Only the points the table reads (the whole grid of the model ran past the GPU round's
            # step limit): prefill at 8,192 tokens, decode at batch 32-256 with a 2,048-token context.
            where = (["--range", "tokens=8192:8192", "--range", "batch=1:1"] if op == "attention_prefill"
                     else ["--range", "batch=32:256", "--range", "context=2048:2048"])
            cmd = [args.opforge, "collect", op, "--system", "compare", "--root", root, "--device", "cuda",
                   "--model", "Llama-3.1-8B", "--tp", "1", "--impl", impl] + where
            print("+", " ".join(cmd), flush=True)
            if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
                print(f"{op} {impl}: collect failed (no such kernel here?)", file=sys.stderr)
        path = os.path.join(root, "compare", op + ".csv")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        head = lines[0].split(",")
        for ln in lines[1:]:
            r = dict(zip(head, ln.split(",")))
            if r["q_heads"] != "32" or r["kv_heads"] != "8":
                continue
            if op == "attention_prefill" and r["batch"] == "1" and r["tokens"] == "8192":
                key = "t8192"
            elif op == "attention_decode" and r["context"] == "2048" and r["batch"] in ("32", "256"):
                key = "b" + r["batch"]
            else:
                continue
            us = float(r["median_us"])
            if (op, key) not in best or us < best[(op, key)][1]:
                best[(op, key)] = (r["impl"], us)
    return best


def attention_table(torch, args, copy_gbps):
    """Markdown rows: opforge's attention against torch's SDPA backends (events around back-to-back
    calls; these kernels run for milliseconds, so host overhead does not matter)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    ours = opforge_attention(args)
    backends = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION))
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    # prefill: 8192 tokens causal, 32 query / 8 KV heads x 128
    T, hq, hk, d = 8192, 32, 8, 128
    flops = 2.0 * T * T * hq * d  # QK^T and PV over the causal half: 4 * T^2 / 2 * hq * d
    q = torch.randn(1, hq, T, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, hk, T, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, hk, T, d, device="cuda", dtype=torch.bfloat16, generator=g)
    res = {}
    for name, be in backends:
        try:
            with sdpa_kernel([be]):
                res[name] = time_stream_us(torch, lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=True), (), max(5, args.reps // 5))
        except Exception as e:  # noqa: BLE001 (a backend that cannot run this shape is reported)
            print(f"sdpa {name}: {e}", file=sys.stderr)
            res[name] = None
    impl, us = ours.get(("attention_prefill", "t8192"), (None, None))
    tf = lambda t: "n/a" if not t else f"{flops / (t * 1e-6) / 1e12:.0f}"  # noqa: E731
    fastest = min((t for t in res.values() if t), default=None)
    rows.append(f"| attention_prefill | 8192 tokens causal, 32/8 x 128 | {fmt(us)} ({impl or '-'}) | {tf(us)} | "
                + " | ".join(f"{fmt(res[n])} ({tf(res[n])})" for n, _ in backends)
                + f" | {ratio(fastest, us)} |")
    del q, k, v
    torch.cuda.empty_cache()
    # decode: one query token per sequence, context 2048, SDPA on the head-expanded cache
    for B in (32, 256):
        C = 2048
        kv_bytes = 2.0 * B * hk * C * d * 2
        q = torch.randn(B, hq, 1, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, hk, C, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, hk, C, d, device="cuda", dtype=torch.bfloat16, generator=g)
        ke, ve = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
        res = {}
        for name, be in backends:
            try:
                with sdpa_kernel([be]):
                    res[name] = time_stream_us(torch, lambda: F.scaled_dot_product_attention(q, ke, ve),
                                               (), args.reps)
            except Exception as e:  # noqa: BLE001
                print(f"sdpa decode {name}: {e}", file=sys.stderr)
                res[name] = None
        impl, us = ours.get(("attention_decode", f"b{B}"), (None, None))
        pct = lambda t: "n/a" if not t or not copy_gbps else f"{kv_bytes / (t * 1e-6) / 1e9 / copy_gbps * 100:.0f}%"  # noqa: E731
        fastest = min((t for t in res.values() if t), default=None)
        rows.append(f"| attention_decode | batch {B}, context {C}, 32/8 x 128 | {fmt(us)} ({impl or '-'}) | {pct(us)} | "
                    + " | ".join(f"{fmt(res[n])} ({pct(res[n])})" for n, _ in backends)
                    + f" | {ratio(fastest, us)} |")
        del q, k, v, ke, ve
        torch.cuda.empty_cache()
    return rows


def fmt(v):
    return "n/a" if v is None else f"{v:.2f}"


def ratio(a, b):
    return "n/a" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--opforge", default="build-gpu/bin/opforge")
    ap.add_argument("--bench-json", help="reuse an opforge bench JSON instead of running the bench")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "out"), "compare-torch.md"))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--prefill-impls", default="cudnn cuda_wmma2",
                    help="attention_prefill kernels to time through `opforge collect` (missing ones are skipped)")
    ap.add_argument("--decode-impls", default="cuda_split_mma cuda_split_async",
                    help="attention_decode kernels to time through `opforge collect` (missing ones are skipped)")
    ap.add_argument("--no-attention", action="store_true", help="leave out the attention section")
    ap.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="only these ops (default: all)")
    args = ap.parse_args()
    args.out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(args.out_dir, exist_ok=True)

    import torch  # noqa: E402 (after argparse: --help works without torch)
    if not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device")
    ours, copy_gbps, card = opforge_times(args)
    make = torch_cases(torch)

    rows, stream_rows = [], []
    for op, tokens, width, label in cases(args.ops):
        inputs, eager, math, nbytes = make(op, tokens, width)
        compiled = torch.compile(math, dynamic=False)
        res = {}
        for name, fn in (("eager", eager), ("compile", compiled)):
            try:
                res[name] = time_graph_us(torch, fn, inputs, args.reps)
            except Exception as e:  # noqa: BLE001 (a failed capture is reported, not fatal)
                print(f"{op} {label} {name}: graph timing failed: {e}", file=sys.stderr)
                res[name] = None
            try:
                res[name + "_stream"] = time_stream_us(torch, fn, inputs, args.reps)
            except Exception as e:  # noqa: BLE001
                print(f"{op} {label} {name}: timing failed: {e}", file=sys.stderr)
                res[name + "_stream"] = None
        impl, us = ours.get((op, label), (None, None))
        pct = (nbytes / (us * 1e-6) / 1e9 / copy_gbps * 100) if us and copy_gbps else None
        rows.append(f"| {op} | {label} | {fmt(us)} ({impl or '-'}) | "
                    f"{'n/a' if pct is None else f'{pct:.0f}%'} | {fmt(res['eager'])} | "
                    f"{fmt(res['compile'])} | {ratio(res['eager'], us)} | {ratio(res['compile'], us)} |")
        stream_rows.append(f"| {op} | {label} | {fmt(res['eager_stream'])} | {fmt(res['compile_stream'])} |")
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()

    attn_rows = [] if args.no_attention else attention_table(torch, args, copy_gbps)
    name = torch.cuda.get_device_name(0)
    text = "\n".join([
        f"# opforge vs torch on {name} (torch {torch.__version__})",
        "",
        f"bf16, hidden {HIDDEN}, intermediate {INTER}. Every number: median µs per call of {BATCH} calls "
        f"captured in one CUDA graph, replays timed with CUDA events. opforge from `opforge bench` "
        f"(perf mode, same timing; fastest CUDA kernel of the case; copy ceiling of that run "
        f"{copy_gbps:.0f} GB/s on {card or name}). torch eager: F.rms_norm, F.layer_norm, F.silu(a) * b, "
        f"F.gelu(a) * b, F.gelu(x, approximate='tanh'), F.cross_entropy(logits.float(), target); "
        f"torch.compile: the same (vLLM's formulation for the RMS norms), default mode. "
        f"Ratio > 1: opforge is faster.",
        "",
        "| op | case | opforge µs (kernel) | opforge % copy | torch eager µs | torch.compile µs | eager / opforge | compile / opforge |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"torch without a graph (events around {BATCH} back-to-back calls; host overhead shows at small sizes):",
        "",
        "| op | case | torch eager µs | torch.compile µs |",
        "|---|---|---|---|",
        *stream_rows,
        "",
        "Attention against torch's scaled_dot_product_attention backends (bf16; µs per call from "
        "events around back-to-back calls; opforge from `opforge collect` rows of the same run, "
        "Llama-3.1-8B shapes at TP 1, cold operands). Prefill: µs (TFLOP/s, 2 T^2 H d flops of "
        "the causal half). Decode: µs (% of the copy ceiling, K and V read once; torch runs on the "
        "head-expanded cache). Last column: the fastest torch backend's time over opforge's.",
        "",
        "| op | shape | opforge µs (kernel) | opforge TFLOP/s or % copy | SDPA cuDNN | SDPA flash | SDPA efficient | fastest torch / opforge |",
        "|---|---|---|---|---|---|---|---|",
        *attn_rows,
        "",
    ])
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
