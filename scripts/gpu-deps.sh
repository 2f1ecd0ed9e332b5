#!/usr/bin/env bash
# Downloads, on this (Debian) machine, the .deb packages that scripts/gpu-check.sh unpacks on the
# lent GPU machine: that machine has nvcc, cmake, ninja and a host compiler but not these libraries,
# and it cannot reach a package registry. The files land in .gpudeps/ (git-ignored); pass
# carry [".gpudeps"] to the device tool so they travel with the working tree.
#
# Needed by the build with OPFORGE_BUILD_BENCH=OFF (gpu-check.sh's configuration):
#   fmt (headers + shared library), nlohmann-json (headers), CLI11 (headers),
#   Highway (headers + shared library), GoogleTest + GoogleMock (static libraries).
# Google Benchmark is left out: gpu-check.sh does not build bench/.
# Also the pinned nvidia-cudnn-frontend wheel (scripts/cudnn-frontend.sh; header-only, for the cudnn
# impl of attention_prefill): gpu-check.sh unpacks its include/ there. cuDNN itself (cudnn.h,
# libcudnn.so.9) comes from the GPU machine's nvidia-cudnn pip package; the cuDNN 9 headers of this
# machine (cudnn*.h beside nvcc's includes) go into .gpudeps/cudnn-include so the GPU build compiles
# the frontend against the headers it was checked with here (the library is loaded at run time and
# the frontend checks its version there).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.gpudeps"
packages=(libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libhwy-dev libhwy1 libgtest-dev libgmock-dev)

# `apt-get download` needs the package lists; fetch them once if this machine has none yet.
if ! apt-cache show libfmt-dev >/dev/null 2>&1; then
  apt-get update -qq
fi

rm -rf "$dest"
mkdir -p "$dest"
cd "$dest"
apt-get download -q "${packages[@]}"
"$root/scripts/cudnn-frontend.sh"
cp "$root"/.deps/cudnn-frontend/nvidia_cudnn_frontend-*.whl "$dest"/
cuda_include="$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/../include"
if [[ -f $cuda_include/cudnn.h ]]; then
  mkdir -p "$dest/cudnn-include" && cp "$cuda_include"/cudnn*.h "$dest/cudnn-include/"
else
  echo "gpu-deps: no cudnn.h beside nvcc; the GPU build uses the pip package's headers"
fi
echo "gpu-deps: $(ls "$dest"/*.deb | wc -l) packages + $(ls "$dest"/*.whl | wc -l) wheel, $(du -sh "$dest" | cut -f1) in $dest"
ls -1 "$dest"
