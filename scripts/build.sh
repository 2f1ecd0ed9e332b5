#!/usr/bin/env bash
# Configure and build one preset of opforge.
#
#   scripts/build.sh [release|asan|fuzz|cuda] [extra cmake -D arguments...]
#
#   release  build/        Release; CUDA when nvcc is found (OPFORGE_CUDA=AUTO); tests + bench
#   asan     build-asan/   AddressSanitizer + UndefinedBehaviorSanitizer, -O1 -g with asserts on,
#                          CUDA off; tests
#   fuzz     build-fuzz/   clang, libFuzzer targets only (fuzz/), the library instrumented with
#                          -fsanitize=fuzzer-no-link,address,undefined; CUDA off
#   cuda     build-cuda/   the library alone with -DOPFORGE_CUDA=ON -DOPFORGE_CUDA_ARCH=90: a
#                          compile check that CUDA sources build (no GPU needed)
#
# Environment: JOBS (default 2), BUILD_DIR (overrides the folder), GENERATOR (default Ninja when
# ninja is installed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset=${1:-release}
shift || true
jobs=${JOBS:-2}
generator=${GENERATOR:-}
if [[ -z $generator ]] && command -v ninja >/dev/null 2>&1; then generator=Ninja; fi

# nvcc installed but not on PATH (the CUDA toolkit's usual place).
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

targets=()
case $preset in
  release)
    dir=build
    args=(-DCMAKE_BUILD_TYPE=Release)
    ;;
  asan)
    dir=build-asan
    args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g"
          -DOPFORGE_SANITIZE=ON -DOPFORGE_CUDA=OFF -DOPFORGE_BUILD_BENCH=OFF)
    ;;
  fuzz)
    dir=build-fuzz
    flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    export CC=${FUZZ_CC:-clang} CXX=${FUZZ_CXX:-clang++}
    args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g"
          "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
          -DOPFORGE_FUZZ=ON -DOPFORGE_CUDA=OFF -DOPFORGE_BUILD_TESTS=OFF -DOPFORGE_BUILD_BENCH=OFF)
    targets=(--target opforge_fuzzers)
    ;;
  cuda)
    dir=build-cuda
    args=(-DCMAKE_BUILD_TYPE=Release -DOPFORGE_CUDA=ON -DOPFORGE_CUDA_ARCH=90
          -DOPFORGE_BUILD_TESTS=OFF -DOPFORGE_BUILD_BENCH=OFF)
    targets=(--target opforge)
    ;;
  *)
    echo "usage: scripts/build.sh [release|asan|fuzz|cuda] [cmake args...]" >&2
    exit 2
    ;;
esac
dir=${BUILD_DIR:-$dir}

gen_args=()
# The generator of an existing build folder cannot change; pass it only on first configure.
if [[ -n $generator && ! -f $dir/CMakeCache.txt ]]; then gen_args=(-G "$generator"); fi

echo "build.sh: $preset -> $dir"
cmake -S . -B "$dir" "${gen_args[@]}" "${args[@]}" "$@"
cmake --build "$dir" -j "$jobs" "${targets[@]}"
