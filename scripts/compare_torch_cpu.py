#!/usr/bin/env python3
"""opforge's cpu kernels against PyTorch on the CPU, side by side in one run on one machine.

For each comparison, opforge's time is the harness's perf-mode median (`opforge bench --case ...`,
bf16, cpu kernel, the library's own threads) and PyTorch's is the median of timed calls of the
equivalent torch expression on tensors of the same shapes and dtype, with torch using every core.
Both run in this one process tree, one after the other, so machine noise hits them alike; the
speedup is torch time / opforge time.

Usage: scripts/compare-torch-cpu.sh (sets up torch from PyPI, builds opforge, runs this).
       python3 scripts/compare_torch_cpu.py --opforge build/bin/opforge --out docs/perf/torch-cpu.md
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

DT = torch.bfloat16


def rms_norm_torch(tokens, hidden):
    x = torch.randn(tokens, hidden, dtype=DT)
    w = torch.rand(hidden, dtype=DT) + 0.5
    return lambda: F.rms_norm(x, (hidden,), w, 1e-6)


def fused_add_rms_norm_torch(tokens, hidden):
    x = torch.randn(tokens, hidden, dtype=DT)
    residual = torch.randn(tokens, hidden, dtype=DT)
    w = torch.rand(hidden, dtype=DT) + 0.5

    def f():
        s = x + residual
        return F.rms_norm(s, (hidden,), w, 1e-6), s

    return f


def silu_and_mul_torch(tokens, d):
    x = torch.randn(tokens, 2 * d, dtype=DT)
    return lambda: F.silu(x[:, :d]) * x[:, d:]


def rotary_neox_torch(tokens, heads_q, heads_kv, head_size, max_pos=16384):
    """vLLM's native rotary_embedding (NeoX layout, rotary_dim = head_size), in place on q and k."""
    positions = torch.randint(0, max_pos, (tokens,), dtype=torch.int64)
    query = torch.randn(tokens, heads_q * head_size, dtype=DT)
    key = torch.randn(tokens, heads_kv * head_size, dtype=DT)
    inv = 1.0 / (10000 ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(DT)

    def rotate(t, cos, sin):
        t = t.view(tokens, -1, head_size)
        a, b = t.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).view(tokens, -1)

    def f():
        cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query.copy_(rotate(query, cos, sin))
        key.copy_(rotate(key, cos, sin))

    return f


def cross_entropy_torch(tokens, vocab):
    logits = torch.randn(tokens, vocab, dtype=DT)
    target = torch.randint(0, vocab, (tokens,), dtype=torch.int64)
    return lambda: F.cross_entropy(logits, target)


# (op, opforge case label, shape text, torch callable factory, goal: minimum speedup)
COMPARISONS = [
    ("rms_norm", "t1024xh4096", "1024 x 4096", lambda: rms_norm_torch(1024, 4096), 2.0),
    ("fused_add_rms_norm", "t1024xh4096", "1024 x 4096", lambda: fused_add_rms_norm_torch(1024, 4096), 2.0),
    ("silu_and_mul", "t1024xi14336", "1024 x 2*14336", lambda: silu_and_mul_torch(1024, 14336), 2.0),
    ("rotary_embedding", "t1024_q32_kv8_h128", "1024 tok, 32+8 heads x 128, NeoX",
     lambda: rotary_neox_torch(1024, 32, 8, 128), 2.0),
    ("cross_entropy", "t1024xv32000", "1024 x 32000", lambda: cross_entropy_torch(1024, 32000), 2.0),
    ("rms_norm", "t16384xh4096", "16384 x 4096", lambda: rms_norm_torch(16384, 4096), 1.0),
    ("silu_and_mul", "t16384xi14336", "16384 x 2*14336", lambda: silu_and_mul_torch(16384, 14336), 1.0),
]


def time_torch(fn, min_samples=10, min_seconds=0.5):
    for _ in range(3):
        fn()
    samples = []
    start = time.perf_counter()
    while len(samples) < min_samples or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
        if len(samples) >= 200:
            break
    return statistics.median(samples)


def run_opforge(binary, comparisons):
    ops = sorted({c[0] for c in comparisons})
    cases = sorted({c[1] for c in comparisons})
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [binary, "bench", *ops, "--backend", "cpu", "--no-reference", "--dtype", "bf16", "--json", out]
        for c in cases:
            cmd += ["--case", c]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            data = json.load(f)
    times = {}
    for r in data["results"]:
        if r["status"] == "pass":
            times[(r["op"], r["case"])] = (r["median_us"], r["pct_ceiling"])
    return times, data.get("cpu_copy_gbps", 0.0)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opforge", default="build/bin/opforge")
    ap.add_argument("--out", default="docs/perf/torch-cpu.md")
    args = ap.parse_args()

    torch.set_num_threads(os.cpu_count() or 1)
    # Only the comparisons whose op and case this build of opforge has.
    listing = json.loads(subprocess.run([args.opforge, "list", "--json"], check=True, capture_output=True,
                                        text=True).stdout)
    have_ops = {o["name"] for o in (listing["ops"] if isinstance(listing, dict) else listing)}
    todo = [c for c in COMPARISONS if c[0] in have_ops]
    missing = [c for c in COMPARISONS if c[0] not in have_ops]
    valid = []
    for c in todo:  # a case label the op lacks is reported, not silently dropped
        probe = subprocess.run([args.opforge, "bench", c[0], "--case", c[1], "--samples", "1", "--backend", "none-such"],
                               capture_output=True, text=True)
        if "unknown case" in probe.stderr:
            missing.append(c)
        else:
            valid.append(c)

    times, copy_gbps = run_opforge(args.opforge, valid)
    rows, failures = [], 0
    for op, case, shape, make, goal in valid:
        if (op, case) not in times:
            rows.append(f"| {op} | {shape} | (no result) | | | {goal:g}x | FAIL |")
            failures += 1
            continue
        ours, pct = times[(op, case)]
        theirs = time_torch(make())
        speedup = theirs / ours
        ok = speedup >= goal
        failures += not ok
        rows.append(f"| {op} | {shape} | {ours:.1f} ({pct:.0f}% copy) | {theirs:.1f} | {speedup:.2f}x | "
                    f">= {goal:g}x | {'pass' if ok else 'FAIL'} |")
        print(rows[-1], flush=True)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# opforge cpu kernels vs PyTorch on the CPU",
        "",
        f"Measured {now} on {cpu_model()} ({os.cpu_count()} cores), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), bf16, by `scripts/compare-torch-cpu.sh`. "
        f"Copy ceiling measured by opforge in the same run: {copy_gbps:.1f} GB/s.",
        "",
        "Times are medians in µs; speedup = torch / opforge. The required speedup is 2x for the first "
        "five rows (1024 tokens) and never slower (1x) elsewhere.",
        "",
        "| op | shape | opforge µs | torch µs | speedup | goal | verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    if missing:
        lines += ["", "Not compared (op or case not in this build): " +
                  ", ".join(f"{c[0]} {c[1]}" for c in missing)]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}; {failures} comparison(s) below goal")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
