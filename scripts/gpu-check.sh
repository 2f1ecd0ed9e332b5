#!/usr/bin/env bash
# The whole GPU round in one call on a lent H100/H200, from the repository root:
#   1. unpack the .deb files of .gpudeps/ (made by scripts/gpu-deps.sh) into a private prefix,
#   2. configure and build for sm_90 with CMake + Ninja (library, CLI, test binary),
#   3. the CUDA kernel tests (tests/cuda_kernels_test.cpp) and their timing table,
#   4. `opforge check --backend cuda` (test and grad modes, then `--fuzz` draws of every op) and
#      `opforge bench --backend cuda`,
#   5. compute-sanitizer memcheck and racecheck over the CUDA kernel tests and over the harness's
#      CUDA test and grad runs (small and edge cases: the sanitizers slow kernels down a hundredfold),
#   6. the rest of the test binary,
#   7. scripts/compare-torch-gpu.py: opforge vs torch eager and torch.compile on the same card
#      (rms_norm, fused_add_rms_norm, silu_and_mul, bf16, 16 / 1024 / 16384 tokens), and
#      scripts/compare-torch-train.py (cross_entropy and fused_linear_cross_entropy forward +
#      backward at 8,192 tokens x vocab 128,256),
#   8. a dated markdown report (gpu-report-YYYY-MM-DD.md) with the card's name and every figure.
# The most telling steps come first, and the report is rewritten after every step, so a call cut
# short still brings back what ran. Logs are teed into $OUT (the device tool returns at most 8
# files: build.log, gtest.log, check.log, check-test.json, bench.log, bench.json, sanitizer.log and
# the report). Each step has its own time limit; a failing step does not stop the next. A summary
# table is printed last.
#
# Usage (device tool): carry [".gpudeps"], command "bash scripts/gpu-check.sh".
# Environment: OUT (default ./out), JOBS (default: all cores), BUILD_DIR (default build-gpu),
# GPU_CHECK_SKIP (space-separated step names to skip, e.g. "full_tests racecheck_harness"),
# GPU_CHECK_FUZZ (draws per op of the check_fuzz step, default 30),
# GPU_CHECK_BENCH_ARGS (extra `opforge bench` arguments, e.g. "rms_norm --dtype bf16 --group large"),
# GPU_CHECK_COLLECT (a system name, or "auto" for nvidia-h100 / nvidia-h200 by the card: collect the
# quick-grid perf database of this card, step 3a, resuming data/perf/<system> of the working tree;
# GPU_CHECK_COLLECT_OPS limits it to some ops, GPU_CHECK_COLLECT_SECONDS its time, default 420),
# GPU_CHECK_RUN_LAYER (non-empty: step 3c, `opforge run-layer` against the estimate for
# GPU_CHECK_RUN_LAYER_MODELS, default "llama-3.1-8b qwen3-30b-a3b", prefill 512 / 2048 / 8192 tokens
# and decode batch 1 / 32 / 256 at context 2048, from the collected or the tree's database;
# "calibrate": the same with `--calibrate`, the prediction also scaled to the card's ceilings;
# GPU_CHECK_RUN_LAYER_GRAPHS lists the --graph-layers values to run, default 20, and
# GPU_CHECK_RUN_LAYER_SECONDS the step's time, default 300),
# GPU_CHECK_CXX_FLAGS (extra host-compiler flags, e.g. "-include cstdint" to get past a header that
# leans on an include the GPU machine's newer libstdc++ no longer makes for it).
# Needs CMake >= 3.26 on the GPU machine (older CMake cannot ask nvcc for C++20).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
JOBS="${JOBS:-$(nproc)}"
BUILD_DIR="${BUILD_DIR:-build-gpu}"
PREFIX="${TMPDIR:-/tmp}/opforge-gpudeps"
DATE="$(date -u +%Y-%m-%d)"
REPORT="$OUT/gpu-report-$DATE.md"
COMPARE_MD="${TMPDIR:-/tmp}/opforge-compare-torch.md"  # folded into the report ($OUT holds 8 files)
COMPARE_LOG="${TMPDIR:-/tmp}/opforge-compare-torch.log"
TRAIN_MD="${TMPDIR:-/tmp}/opforge-compare-train.md"  # the training-step losses (step 3b)
rm -f "$COMPARE_MD" "$COMPARE_LOG" "$TRAIN_MD"
SKIP=" ${GPU_CHECK_SKIP:-} "
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# NCCL for the all_reduce op's kernel and collect-comm: torch's NCCL wheel when libnccl is not on
# the loader's path.
if [[ -z ${OPFORGE_NCCL_LIBRARY:-} ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
  nccl_lib="$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
  [[ -n $nccl_lib && -f $nccl_lib ]] && export OPFORGE_NCCL_LIBRARY="$nccl_lib"
fi

declare -a STEP_NAMES STEP_STATUS STEP_SECONDS STEP_NOTES
LAST_RAN=0

# run_step NAME LOG LIMIT_SECONDS command...: runs with a time limit, appends output to LOG (and
# the terminal), records pass / FAIL / TIMEOUT and the seconds taken.
run_step() {
  local name="$1" log="$2" limit="$3"
  shift 3
  LAST_RAN=0
  if [[ "$SKIP" == *" $name "* ]]; then
    STEP_NAMES+=("$name") STEP_STATUS+=("skipped") STEP_SECONDS+=("0") STEP_NOTES+=("GPU_CHECK_SKIP")
    return 0
  fi
  LAST_RAN=1
  echo "=== $name: $*" | tee -a "$log"
  local start=$SECONDS rc
  # Through bash -c so that exported shell functions (unpack_deps, configure, build) run too.
  timeout --kill-after=10 "$limit" bash -c '"$@"' run_step "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  local status="pass"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then status="TIMEOUT"; elif [[ $rc -ne 0 ]]; then status="FAIL (rc $rc)"; fi
  STEP_NAMES+=("$name") STEP_STATUS+=("$status") STEP_SECONDS+=("$((SECONDS - start))") STEP_NOTES+=("")
  echo "=== $name: $status in $((SECONDS - start)) s" | tee -a "$log"
  write_report
  [[ $status == pass ]]
}

# note_last TEXT: a note on the step that just ran (none when it was skipped).
note_last() { [[ $LAST_RAN -eq 1 ]] || return 0; STEP_NOTES[${#STEP_NOTES[@]}-1]="$1"; write_report; }

# ---- the report (rewritten after every step, so a call cut short still leaves one) ------------
summary_table() {
  echo "| step | status | seconds | note |"
  echo "|---|---|---|---|"
  for i in "${!STEP_NAMES[@]}"; do
    echo "| ${STEP_NAMES[$i]} | ${STEP_STATUS[$i]} | ${STEP_SECONDS[$i]} | ${STEP_NOTES[$i]} |"
  done
}

section() {  # section TITLE FILE PATTERN [FROM]: lines matching PATTERN (all when empty), from the
  local title="$1" file="$2" pattern="${3:-}" from="${4:-}"  # line starting with FROM on
  echo
  echo "## $title"
  echo
  if [[ ! -s "$file" ]]; then echo "(no output)"; return; fi
  echo '```'
  awk -v from="$from" 'from == "" || index($0, from) == 1 { on = 1 } on' "$file" |
    grep -E "${pattern:-.}" | tail -n 100
  echo '```'
}

write_report() {
  {
    echo "# GPU check, $DATE, $CARD"
    echo
    echo "Produced by scripts/gpu-check.sh; full logs: build.log, gtest.log, check.log, sanitizer.log,"
    echo "bench.log, bench.json (same folder)."
    echo
    echo '```'
    echo "$MACHINE_INFO"
    echo '```'
    echo
    echo "## Summary"
    echo
    summary_table
    section "CUDA kernel timing (tests/cuda_kernels_test.cpp, median of 30 samples of 20 calls: events around plain launches, and a CUDA graph replay)" \
      "$OUT/bench.log" '^\|'
    section "opforge bench --backend cuda" "$OUT/bench.log" '' "=== bench:"
    if [[ -s "$COMPARE_MD" ]]; then echo; sed 's/^# /## /' "$COMPARE_MD";
    else section "compare-torch-gpu.py (no table; log tail)" "$COMPARE_LOG"; fi
    if [[ -s "$TRAIN_MD" ]]; then echo; echo "## Training-step losses vs torch (compare-torch-train.py)"; echo; cat "$TRAIN_MD"; fi
    section "opforge check --backend cuda (test, grad)" "$OUT/check.log"
    section "compute-sanitizer" "$OUT/sanitizer.log" 'SUMMARY|^=== |Invalid|race|Race|error'
    section "CUDA kernel tests" "$OUT/gtest.log" '^\[ *(OK|FAILED|PASSED|SKIPPED) *\]|Failure|error'
  } > "$REPORT"
}


# ---- 0. the machine ---------------------------------------------------------------------------
machine_info() {
  echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M')"
  echo "card: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
  echo "nvcc: $(nvcc --version 2>&1 | grep -o 'release [0-9.]*' | head -1)"
  echo "cmake: $(cmake --version 2>&1 | head -1)"
  echo "host compiler: $(c++ --version 2>&1 | head -1)"
  echo "commit: ${OPFORGE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo 'none (uncommitted tree)')}"
}
CARD="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
CARD="${CARD:-unknown card}"
MACHINE_INFO="$(machine_info)"
echo "$MACHINE_INFO" | tee "$OUT/build.log"

# ---- 1. dependencies --------------------------------------------------------------------------
unpack_deb() {  # unpack_deb FILE DEST: dpkg -x, or by hand where dpkg is missing
  if command -v dpkg >/dev/null; then dpkg -x "$1" "$2"; return; fi
  local member
  member="$(ar t "$1" | grep '^data.tar')" || return 1
  case "$member" in
    *.xz) ar p "$1" "$member" | tar -x -J -C "$2" ;;
    *.zst) ar p "$1" "$member" | tar -x --zstd -C "$2" ;;
    *.gz) ar p "$1" "$member" | tar -x -z -C "$2" ;;
    *) ar p "$1" "$member" | tar -x -C "$2" ;;
  esac
}

unpack_deps() {
  local debs=(.gpudeps/*.deb)
  [[ -e "${debs[0]}" ]] || { echo "no .gpudeps/*.deb: run scripts/gpu-deps.sh here and carry .gpudeps"; return 1; }
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  for f in "${debs[@]}"; do unpack_deb "$f" "$PREFIX" || { echo "cannot unpack $f"; return 1; }; done
  echo "unpacked ${#debs[@]} packages into $PREFIX"
  # The cuDNN frontend headers (the cudnn impl of attention_prefill); without them it is left out.
  local wheels=(.gpudeps/nvidia_cudnn_frontend-*.whl)
  if [[ -e "${wheels[0]}" ]]; then
    bash scripts/cudnn-frontend.sh "${wheels[0]}" "$PREFIX/cudnn-frontend" || echo "cannot unpack ${wheels[0]}"
  else
    echo "no .gpudeps/nvidia_cudnn_frontend-*.whl: the cudnn attention impl is left out"
  fi
  echo "cuDNN (pip nvidia-cudnn): ${CUDNN_PY_DIR:-not found}; headers: ${CUDNN_INCLUDE:-none};" \
    "OPFORGE_CUDNN_LIBRARY=${OPFORGE_CUDNN_LIBRARY:-unset}"
}

configure() {
  local lib="$PREFIX/usr/lib/x86_64-linux-gnu/cmake" share="$PREFIX/usr/share/cmake"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DOPFORGE_CUDA=ON -DOPFORGE_CUDA_ARCH=90 -DOPFORGE_BUILD_BENCH=OFF -DOPFORGE_BUILD_TESTS=ON \
    -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DCMAKE_CXX_FLAGS="${GPU_CHECK_CXX_FLAGS:-}" \
    -Dfmt_DIR="$lib/fmt" -Dhwy_DIR="$lib/hwy" -DGTest_DIR="$lib/GTest" \
    -Dnlohmann_json_DIR="$share/nlohmann_json" -DCLI11_DIR="$share/CLI11" \
    -DCUDNN_FRONTEND_INCLUDE_DIR="$PREFIX/cudnn-frontend/include" \
    -DCUDNN_INCLUDE_DIR="$CUDNN_INCLUDE" ${CUDNN_PY_DIR:+-DCUDNN_LIBRARY_DIR="$CUDNN_PY_DIR/lib"}
}

build() { ninja -C "$BUILD_DIR" -j "$JOBS" -k 0 opforge opforge_cli opforge_tests; }  # -k 0: every error

# cuDNN for the cudnn impl of attention_prefill: headers and libcudnn.so.9 of the nvidia-cudnn pip
# package (torch's), found through python; libcudnn is dlopened at run time from OPFORGE_CUDNN_LIBRARY.
CUDNN_PY_DIR="$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
if [[ -n $CUDNN_PY_DIR && -z ${OPFORGE_CUDNN_LIBRARY:-} && -f $CUDNN_PY_DIR/lib/libcudnn.so.9 ]]; then
  export OPFORGE_CUDNN_LIBRARY="$CUDNN_PY_DIR/lib/libcudnn.so.9"
fi
# cudnn.h: the headers carried from the machine that ran gpu-deps.sh, else the pip package's.
CUDNN_INCLUDE="$root/.gpudeps/cudnn-include"
[[ -f $CUDNN_INCLUDE/cudnn.h ]] || CUDNN_INCLUDE="${CUDNN_PY_DIR:+$CUDNN_PY_DIR/include}"
export CUDNN_PY_DIR CUDNN_INCLUDE
export root PREFIX BUILD_DIR JOBS GPU_CHECK_CXX_FLAGS
export -f unpack_deb unpack_deps configure build

run_step deps "$OUT/build.log" 60 unpack_deps
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
built=0
if run_step configure "$OUT/build.log" 120 configure && run_step build "$OUT/build.log" 420 build; then
  built=1
fi

BIN="$BUILD_DIR/bin/opforge"
TESTS="$BUILD_DIR/tests/opforge_tests"
[[ -x "$TESTS" ]] || TESTS="$(find "$BUILD_DIR" -name opforge_tests -type f -perm -u+x 2>/dev/null | head -1)"

if [[ $built -eq 1 ]]; then
  # Most telling first, so that a call cut short still brings back the essentials.
  # ---- 2. CUDA kernel tests and timing ----------------------------------------------------------
  run_step cuda_tests "$OUT/gtest.log" 240 "$TESTS" --gtest_filter='CudaKernels.*:CudaProbe.*' --gtest_color=no
  note_last "$(grep -Eo '\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ tests?' "$OUT/gtest.log" | tr '\n' ' ')"
  run_step timing "$OUT/bench.log" 240 "$TESTS" --gtest_also_run_disabled_tests \
    --gtest_filter='CudaKernelsTiming.*' --gtest_color=no

  # Note [cuda availability]: with no visible device the probe gives its reason, no crash.
  probe_no_device() {
    local out
    out="$(CUDA_VISIBLE_DEVICES= "$BIN" list 2>&1)"; local rc=$?
    echo "$out" | grep -m3 'unavailable'
    [[ $rc -eq 0 ]] && echo "$out" | grep -q 'unavailable: no CUDA device is visible'
  }
  export BIN
  export -f probe_no_device
  run_step probe_no_device "$OUT/gtest.log" 60 probe_no_device
  note_last "$(grep -m1 -o 'unavailable: [^|]*' "$OUT/gtest.log" | head -1)"

  # ---- 3. harness: correctness, gradients, performance ------------------------------------------
  check_json="$OUT/check-test.json"  # the device tool returns 8 files: the archive takes this one's place
  [[ -n ${GPU_CHECK_COLLECT:-} ]] && check_json="${TMPDIR:-/tmp}/check-test.json"
  run_step check_test "$OUT/check.log" 300 "$BIN" check --backend cuda --mode test --json "$check_json"
  run_step check_grad "$OUT/check.log" 240 "$BIN" check --backend cuda --mode grad
  # Random shapes derived from every op's cases (Note [fuzz derivation] in src/harness/fuzz.cpp;
  # draws rejected for device values only: Note [device values]): 42 s + 5 s on an H200 at 30.
  run_step check_fuzz "$OUT/check.log" 240 "$BIN" check --backend cuda --mode all --fuzz "${GPU_CHECK_FUZZ:-30}"
  # fused_linear_cross_entropy with forced small blocks (Note [flce cuda blocks]): many token and
  # vocabulary blocks, short last ones, at the cases' small sizes (the with-grad op then runs the
  # forward and the backward); then whole rows in blocks of 64 tokens (Note [flce with grad]).
  run_step check_flce_blocks "$OUT/check.log" 120 env OPFORGE_CUDA_FLCE_BLOCK=64x256 "$BIN" check \
    --backend cuda --mode test fused_linear_cross_entropy fused_linear_cross_entropy_backward \
    fused_linear_cross_entropy_with_grad
  run_step check_flce_rows "$OUT/check.log" 120 env OPFORGE_CUDA_FLCE_BLOCK=64x1000000000 "$BIN" check \
    --backend cuda --mode test fused_linear_cross_entropy_with_grad
  # cross_entropy_with_grad with every row in a cluster of 8 CTAs (Note [ce with grad clusters]):
  # the distributed-shared-memory merge over the most ranks, and ranks with short or empty slices.
  run_step check_ce_grad_clusters "$OUT/check.log" 120 env OPFORGE_CE_GRAD_CLUSTER=8 "$BIN" check \
    --backend cuda --mode test cross_entropy_with_grad
  # shellcheck disable=SC2086 # word splitting of the extra arguments is wanted
  run_step bench "$OUT/bench.log" 300 "$BIN" bench ${GPU_CHECK_BENCH_ARGS:-} --backend cuda --json "$OUT/bench.json"

  # ---- 3a. the performance database of this card (GPU_CHECK_COLLECT=<system>) -----------------
  # `opforge collect --grid quick --device cuda` into a scratch root, then leave-one-out
  # validation; the CSVs come back as one archive, $OUT/perfdb-<system>.tar.gz (unpack it under
  # data/perf/). With 2+ GPUs the NCCL all-reduce table is collected too.
  PERF_ROOT="${TMPDIR:-/tmp}/opforge-perf"
  if [[ ${GPU_CHECK_COLLECT:-} == auto ]]; then
    case "$CARD" in
      *H200*) GPU_CHECK_COLLECT=nvidia-h200 ;;
      *H100*) GPU_CHECK_COLLECT=nvidia-h100 ;;
      *) GPU_CHECK_COLLECT="$(echo "$CARD" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')" ;;
    esac
  fi
  if [[ -n ${GPU_CHECK_COLLECT:-} ]]; then
    collect_db() {
      local root="$PERF_ROOT"
      if [[ -d data/perf/$GPU_CHECK_COLLECT && ! -d $root/$GPU_CHECK_COLLECT ]]; then  # resume the tree's rows
        mkdir -p "$root" && cp -r "data/perf/$GPU_CHECK_COLLECT" "$root/"
      fi
      # Stops short of the step's limit so that what was measured still gets archived (rows are
      # written as they are measured; a later call resumes).
      local budget=$(( ${GPU_CHECK_COLLECT_SECONDS:-420} - 40 ))
      # shellcheck disable=SC2086 # word splitting of the op list is wanted
      timeout --kill-after=5 "$budget" "$BIN" collect --system "$GPU_CHECK_COLLECT" --grid quick --device cuda \
        --root "$root" ${GPU_CHECK_COLLECT_OPS:-} || echo "collect stopped (status $?); archiving what was measured"
      if [[ $(nvidia-smi -L 2>/dev/null | wc -l) -ge 2 ]]; then
        "$BIN" collect-comm --system "$GPU_CHECK_COLLECT" --root "$root" || echo "collect-comm failed"
      fi
      "$BIN" perfdb validate --system "$GPU_CHECK_COLLECT" --root "$root" || true
      tar -C "$root" -czf "$OUT/perfdb-$GPU_CHECK_COLLECT.tar.gz" "$GPU_CHECK_COLLECT"
    }
    export -f collect_db
    export GPU_CHECK_COLLECT GPU_CHECK_COLLECT_OPS PERF_ROOT
    run_step collect "$OUT/bench.log" "${GPU_CHECK_COLLECT_SECONDS:-420}" collect_db
  fi

  # ---- 3c. one decoder layer measured against the estimate (GPU_CHECK_RUN_LAYER) ---------------
  if [[ -n ${GPU_CHECK_RUN_LAYER:-} ]]; then
    run_layers() {
      local system="${GPU_CHECK_COLLECT:-nvidia-h200}" data="$PERF_ROOT"
      [[ -d $data/$system ]] || data=data/perf
      local m cal=()
      [[ ${GPU_CHECK_RUN_LAYER:-} == calibrate ]] && cal=(--calibrate)
      for g in ${GPU_CHECK_RUN_LAYER_GRAPHS:-20}; do
        for m in ${GPU_CHECK_RUN_LAYER_MODELS:-llama-3.1-8b qwen3-30b-a3b}; do
          for t in 512 2048 8192; do
            OPFORGE_PERF_DATA="$data" "$BIN" run-layer --model "$m" --tokens "$t" --device cuda --system "$system" \
              --repeat 10 --graph-layers "$g" "${cal[@]}" || echo "run-layer $m prefill $t failed"
          done
          for b in 1 32 256; do
            OPFORGE_PERF_DATA="$data" "$BIN" run-layer --model "$m" --batch "$b" --context 2048 --device cuda \
              --system "$system" --repeat 10 --graph-layers "$g" "${cal[@]}" || echo "run-layer $m decode batch $b failed"
          done
        done
      done
    }
    export -f run_layers
    export GPU_CHECK_COLLECT GPU_CHECK_RUN_LAYER GPU_CHECK_RUN_LAYER_MODELS GPU_CHECK_RUN_LAYER_GRAPHS PERF_ROOT
    run_step run_layer "$OUT/bench.log" "${GPU_CHECK_RUN_LAYER_SECONDS:-300}" run_layers
  fi

  # ---- 3b. side by side with torch (eager, torch.compile) on this card ---------------------------
  compare_args=(--opforge "$BIN" --out "$COMPARE_MD")
  if [[ -s "$OUT/bench.json" ]] && grep -q '"t16384xh4096"' "$OUT/bench.json" &&
     grep -q '"t16384xi14336"' "$OUT/bench.json"; then
    compare_args+=(--bench-json "$OUT/bench.json")
  fi
  # 420 s: torch.compile compiles every op and shape first; with its attention collects the step ran
  # past 300 s on an H200 (2026-11-30).
  run_step compare_torch "$COMPARE_LOG" 420 env PYTHONUNBUFFERED=1 python3 scripts/compare-torch-gpu.py "${compare_args[@]}"
  # cross_entropy and fused_linear_cross_entropy forward + backward at a training step's shape.
  run_step compare_torch_train "$COMPARE_LOG" 300 env PYTHONUNBUFFERED=1 python3 scripts/compare-torch-train.py \
    --opforge "$BIN" --out "$TRAIN_MD" --out-dir "${TMPDIR:-/tmp}"

  # ---- 4. sanitizers ----------------------------------------------------------------------------
  if command -v compute-sanitizer >/dev/null; then
    # racecheck leaves out the cuBLASLt test: it reports shared-memory hazards inside cuBLAS's own
    # split-K GEMM kernels (nvjet_sm90_*_splitK), vendor code; memcheck still runs it.
    for tool in memcheck racecheck; do
      filter='CudaKernels.*:CudaSoftmax.*-*Beyond2Pow31*'
      [[ $tool == racecheck ]] && filter+=':*CublasLt*'
      run_step "${tool}_kernels" "$OUT/sanitizer.log" 300 compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$TESTS" --gtest_filter="$filter" --gtest_color=no
      note_last "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)"
    done
    # --report-api-errors no: NCCL's communicator set-up (the all_reduce op) probes its kernels with
    # CUDA calls that fail by design (cudaErrorNoKernelImageForDevice for other architectures);
    # opforge's own CUDA calls are checked by the code and throw, which the harness reports.
    # racecheck leaves out cuDNN's generated attention kernels (cudnn_generated_*, the `cudnn` impl
    # of attention_prefill): it reports shared-memory hazards inside them (their TMA / wgmma
    # pipelines synchronize through mbarriers), vendor code as cuBLAS's above; memcheck runs them.
    for tool in memcheck racecheck; do
      exclude=()
      [[ $tool == racecheck ]] && exclude=(--kernel-name-exclude kns=cudnn_generated)
      # test and grad modes (a backward op runs in grad mode only) over the small and edge cases.
      run_step "${tool}_harness" "$OUT/sanitizer.log" 420 compute-sanitizer --tool "$tool" --error-exitcode 3 \
        --report-api-errors no "${exclude[@]}" "$BIN" check --backend cuda --mode all --group small --group edge
      note_last "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)"
    done
  else
    STEP_NAMES+=("sanitizer") STEP_STATUS+=("skipped") STEP_SECONDS+=("0") STEP_NOTES+=("no compute-sanitizer")
  fi

  # ---- 5. the rest of the test binary -----------------------------------------------------------
  run_step full_tests "$OUT/gtest.log" 300 "$TESTS" --gtest_filter='-CudaKernels.*:CudaKernelsTiming.*' \
    --gtest_brief=1 --gtest_color=no
  note_last "$(tail -n 40 "$OUT/gtest.log" | grep -Eo '\[  (PASSED|FAILED) +\] [0-9]+ tests?' | tail -1)"
fi

# ---- 6. report -----------------------------------------------------------------------------------
write_report

echo
echo "report: $REPORT"
echo "card: $CARD"
summary_table
