#!/usr/bin/env bash
# opforge's cpu kernels vs PyTorch on the CPU, side by side in one run (not part of CI).
#   1. set-up: a virtual environment .venv-torch/ with torch and numpy from PyPI (first run only;
#      PyPI's Linux torch wheel pulls its CUDA libraries too, about 5 GB, though only the CPU is used)
#   2. scripts/setup.sh + a release build (scripts/build.sh release)
#   3. scripts/compare_torch_cpu.py: the table, written to docs/perf/torch-cpu.md
# Environment: TORCH_VERSION (default 2.11.0), VENV (default .venv-torch), OUT (the table's path).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=${VENV:-.venv-torch}
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "torch==${TORCH_VERSION:-2.11.0}" numpy
fi
bash scripts/setup.sh
bash scripts/build.sh release
"$venv/bin/python" scripts/compare_torch_cpu.py --opforge build/bin/opforge --out "${OUT:-docs/perf/torch-cpu.md}"
