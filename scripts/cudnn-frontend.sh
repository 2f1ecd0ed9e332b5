#!/usr/bin/env bash
# Fetches the cuDNN frontend (NVIDIA's header-only C++ graph API over cuDNN) for the `cudnn` impl
# of attention_prefill (ops/attention/cuda_prefill_cudnn.cu): pip downloads the pinned
# nvidia-cudnn-frontend wheel (a zip) and its include/ folder is unpacked into
# .deps/cudnn-frontend/include (git-ignored), where CMake looks. The wheel itself stays in
# .deps/cudnn-frontend/ so scripts/gpu-deps.sh can carry it to a GPU machine without internet.
# Idempotent: nothing is fetched when the pinned version is already unpacked.
#   scripts/cudnn-frontend.sh            fetch + unpack here
#   scripts/cudnn-frontend.sh WHEEL DEST unpack a wheel already on disk into DEST/include
set -euo pipefail

VERSION=1.32.0  # pinned; the headers are the same in every platform's wheel
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

unpack() {  # unpack WHEEL DEST: include/ of the wheel into DEST/include
  local wheel="$1" dest="$2"
  rm -rf "$dest/include"
  mkdir -p "$dest"
  python3 - "$wheel" "$dest" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith("include/")]
    if not any(m == "include/cudnn_frontend.h" for m in members):
        sys.exit(f"{wheel}: no include/cudnn_frontend.h")
    z.extractall(dest, members)
PY
  echo "cudnn-frontend: $(ls "$dest/include" | wc -l) entries in $dest/include"
}

if [[ $# -eq 2 ]]; then
  unpack "$1" "$2"
  exit 0
fi

dest="$root/.deps/cudnn-frontend"
stamp="$dest/include/.version"
if [[ -f $stamp && $(cat "$stamp") == "$VERSION" ]]; then
  echo "cudnn-frontend: $VERSION present in $dest/include"
  exit 0
fi
mkdir -p "$dest"
rm -f "$dest"/nvidia_cudnn_frontend-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version 3.11 \
  --abi cp311 --platform manylinux_2_28_x86_64 -d "$dest" "nvidia-cudnn-frontend==$VERSION"
wheel="$(ls "$dest"/nvidia_cudnn_frontend-"$VERSION"-*.whl | head -1)"
unpack "$wheel" "$dest"
echo "$VERSION" > "$stamp"
