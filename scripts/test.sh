#!/usr/bin/env bash
# The full check, as CI runs it (.ci/run):
#   1. scripts/setup.sh                     system packages
#   2. release build + ctest                 (CUDA compiled in when nvcc is present)
#   3. ASan + UBSan build + ctest            (CUDA off)
#   4. fuzz build (clang) + each fuzzer for FUZZ_SECONDS (default 60)
#   5. CUDA compile check                    when nvcc is present and stage 2 did not build CUDA
# Environment: JOBS (default 2), FUZZ_SECONDS (default 60), SKIP_FUZZ=1 / SKIP_ASAN=1 for quick
# local runs (CI sets neither).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export JOBS=${JOBS:-2}
fuzz_seconds=${FUZZ_SECONDS:-60}
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

timings=()
stage() {  # stage NAME COMMAND...: run, time, and remember the time for the summary
  local name=$1 start=$SECONDS
  shift
  echo
  echo "==== test.sh: $name"
  "$@"
  timings+=("$(printf '%-34s %5ds' "$name" $((SECONDS - start)))")
  echo "==== test.sh: $name done in $((SECONDS - start))s"
}

ctest_passed=0
ctest_failed=0
run_ctest() {  # run_ctest BUILD_DIR: ctest, with its totals added to the final summary
  local log=$1/ctest-output.log rc=0
  ctest --test-dir "$1" --output-on-failure -j "$JOBS" --timeout 900 2>&1 | tee "$log" || rc=$?
  local line total failed
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true)
  total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
  failed=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  ctest_passed=$((ctest_passed + ${total:-0} - ${failed:-0}))
  ctest_failed=$((ctest_failed + ${failed:-0}))
  return "$rc"
}

run_ctest_sanitized() {
  ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_ctest "$1"
}

run_fuzzers() {
  local t
  for t in policy_fuzz config_fuzz npy_fuzz perfdb_fuzz; do
    local work=build-fuzz/corpus/$t dict=fuzz/${t%_fuzz}.dict
    mkdir -p "$work"
    echo "-- $t for ${fuzz_seconds}s"
    if ! build-fuzz/fuzz/$t -max_total_time="$fuzz_seconds" -timeout=20 -rss_limit_mb=2048 \
        -print_final_stats=1 -dict="$dict" -artifact_prefix=build-fuzz/ \
        "$work" "fuzz/corpus/$t" >"build-fuzz/$t.log" 2>&1; then
      tail -n 60 "build-fuzz/$t.log"
      echo "test.sh: $t found a crash (artifact in build-fuzz/, log in build-fuzz/$t.log)" >&2
      return 1
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "build-fuzz/$t.log" || true
  done
}

cuda_check() {
  if ! command -v nvcc >/dev/null 2>&1; then
    echo "nvcc not found: CUDA compile check skipped"
  elif grep -q '^CMAKE_CUDA_COMPILER:[A-Z]*=/' build/CMakeCache.txt 2>/dev/null &&
       grep -q '^OPFORGE_CUDA_ARCH:STRING=90$' build/CMakeCache.txt; then
    echo "the release build already compiled the CUDA backend for arch 90"
  else
    bash scripts/build.sh cuda
  fi
}

total_start=$SECONDS
stage "setup" bash scripts/setup.sh
stage "release build" bash scripts/build.sh release
stage "release ctest" run_ctest build
if [[ ${SKIP_ASAN:-0} != 1 ]]; then
  stage "asan+ubsan build" bash scripts/build.sh asan
  stage "asan+ubsan ctest" run_ctest_sanitized build-asan
fi
if [[ ${SKIP_FUZZ:-0} != 1 ]]; then
  stage "fuzz build" bash scripts/build.sh fuzz
  stage "fuzz run (${fuzz_seconds}s each)" run_fuzzers
fi
stage "cuda compile check" cuda_check

echo
echo "==== test.sh: all stages passed in $((SECONDS - total_start))s"
printf '  %s\n' "${timings[@]}"
echo "ctest: $ctest_passed passed, $ctest_failed failed"
