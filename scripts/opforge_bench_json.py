"""Running `opforge bench --json` and reading its results, for the side-by-side scripts
(compare-torch-gpu.py, compare-torch-train.py)."""
import json
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
