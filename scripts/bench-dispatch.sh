#!/usr/bin/env bash
# Runs bench/dispatch_bench.cpp (opforge_bench) and prints the dispatch overhead of a Slot call
# over a direct function-pointer call, in ns per call.
#
#   scripts/bench-dispatch.sh [build folder, default build/]   (builds the release preset if needed)
# Extra Google Benchmark flags can be passed in BENCH_ARGS, e.g. BENCH_ARGS=--benchmark_repetitions=5.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir=${1:-build}
if [[ ! -x $dir/bench/opforge_bench ]]; then
  BUILD_DIR=$dir bash scripts/build.sh release >/dev/null
  cmake --build "$dir" -j "${JOBS:-2}" --target opforge_bench
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
# shellcheck disable=SC2086
"$dir/bench/opforge_bench" --benchmark_min_time=0.5 --benchmark_out="$out" \
  --benchmark_out_format=json ${BENCH_ARGS:-}

python3 - "$out" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
# With repetitions, use the median aggregate; otherwise the single run.
def pick(name):
    rows = [b for b in runs if b["run_name"] == name]
    med = [b for b in rows if b.get("aggregate_name") == "median"]
    row = (med or rows)[0]
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[row["time_unit"]]
    return row["cpu_time"] * scale, row  # CPU time: steadier than wall time on a busy machine
direct, _ = pick("BM_DirectCall")
print()
print(f"{'call':<28}{'ns/call':>10}{'overhead vs direct':>22}")
for name in ("BM_DirectCall", "BM_SlotCall", "BM_SlotCallWithPredicate", "BM_BoxedCall"):
    if not any(b["run_name"] == name for b in runs):
        continue
    ns, row = pick(name)
    note = f"  ({row['label']}, {int(row['candidates'])} candidates)" if "candidates" in row else ""
    print(f"{name:<28}{ns:>10.2f}{ns - direct:>19.2f} ns{note}")
slot, _ = pick("BM_SlotCall")
print(f"\ndispatch overhead (slot - direct): {slot - direct:.2f} ns")
PY
