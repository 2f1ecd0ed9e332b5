"""What the side-by-side scripts (compare-torch-gpu.py, compare-torch-train.py) share: running
`opforge bench --json` and reading its results, and timing torch with CUDA events."""
import json
import statistics
import subprocess


def run_bench(opforge, bench_args, path):
    """Runs `opforge bench <bench_args> --json path` and returns the parsed JSON document."""
    cmd = [opforge, "bench", *bench_args, "--json", path]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return load(path)


def load(path):
    with open(path) as f:
        return json.load(f)


def fastest_cuda(doc, dtype="bf16"):
    """{(op, case label): (impl, median us)}: the fastest CUDA kernel of each passing perf case."""
    best = {}
    for r in doc["results"]:
        if r["mode"] != "perf" or r["status"] != "pass" or r["dtype"] != dtype:
            continue
        if not r["device"].startswith("cuda") or r["median_us"] <= 0:
            continue
        key = (r["op"], r["case"])
        if key not in best or r["median_us"] < best[key][1]:
            best[key] = (r["impl"], r["median_us"])
    return best


def events_median_ms(torch, call, iters, reps):
    """Median over `reps` runs of (CUDA-event time of `iters` back-to-back calls) / iters, in ms,
    after three warm-up calls (host overhead included)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(iters):
            call()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / iters)
    return statistics.median(samples)
