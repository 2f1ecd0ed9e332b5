#!/usr/bin/env bash
# Installs every system package opforge needs to build, test, fuzz and benchmark, from Debian.
# Idempotent: packages already present are left alone, and apt-get update runs only when
# something is missing. Runs as root, or through sudo when not root.
#
# CUDA is optional and never installed here: when nvcc is on PATH (or in /usr/local/cuda/bin)
# the build and scripts/test.sh use it. The cuDNN frontend headers are fetched into .deps/ by
# scripts/cudnn-frontend.sh (pip download of a pinned wheel).
set -euo pipefail

PACKAGES=(
  build-essential g++ cmake ninja-build
  libfmt-dev nlohmann-json3-dev libcli11-dev libhwy-dev libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libomp-dev
  clang libclang-rt-14-dev  # the fuzz build: clang++ and libFuzzer / sanitizer runtimes
  python3
)

# The cuDNN frontend headers (pinned wheel from PyPI) for the cudnn impl of attention_prefill; a
# CUDA build without them leaves that impl out, so a failure here is not fatal.
"$(dirname "${BASH_SOURCE[0]}")/cudnn-frontend.sh" ||
  echo "setup: cuDNN frontend headers not fetched; CUDA builds leave the cudnn attention impl out" >&2

missing=()
for pkg in "${PACKAGES[@]}"; do
  # dpkg-query prints "install ok installed" only for a package that is fully installed.
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: missing packages (${missing[*]}) and neither root nor sudo available" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
