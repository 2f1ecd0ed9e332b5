#!/usr/bin/env bash
# The README's first command: set up, build, and take a short tour of opforge on its embedded
# cases: the registry (`opforge list`), the proof (`opforge check`, test + grad modes) and the
# measurement (`opforge bench`, small and medium groups; `--group large` for model-sized cases),
# and the prediction: `opforge estimate` of Llama-3.1-8B from the perf database shipped in
# data/perf/ (collected on the 2-core development machine; `opforge collect` makes one for yours).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
bash scripts/build.sh release
bin=build/bin/opforge

echo; echo "==== opforge list"
"$bin" list
echo; echo "==== opforge explain rms_norm --ops 'rms_norm=cpu,strict'"
"$bin" explain rms_norm --ops 'rms_norm=cpu,strict'
echo; echo "==== opforge check (test + grad modes, every kernel and dtype)"
"$bin" check --json build/check.json --csv build/check.csv | tail -n 25
echo; echo "==== opforge bench --group small --group medium"
"$bin" bench --group small --group medium --json build/bench.json --csv build/bench.csv
echo; echo "full results: build/check.json, build/check.csv, build/bench.json, build/bench.csv"
echo; echo "==== opforge support --model llama-3.1-8b --system cpu-epyc-zen3-2c --input-len 128"
"$bin" support --model llama-3.1-8b --system cpu-epyc-zen3-2c --input-len 128 | tail -n 3
echo; echo "==== opforge estimate --model llama-3.1-8b --system cpu-epyc-zen3-2c --input-len 128 --output-len 32"
"$bin" estimate --model llama-3.1-8b --system cpu-epyc-zen3-2c --input-len 128 --output-len 32 --json build/estimate.json
