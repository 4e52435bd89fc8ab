#!/usr/bin/env bash
# Installs NVIDIA's CUDA runtimes 12.9 and 13.2 (libcudart.so.12 / .so.13,
# 3.5 MB and 2.3 MB wheels from PyPI) into a cache directory, for the tests
# that run the real runtime on simgpu (tests/tests/cudart.rs), and NVML's
# header (nvml.h, 0.1 MB wheel) for scripts/gen-driver-types.py. Prints the
# directory; the tests find it through DILU_CUDART_DIR.
#
#   scripts/install-cudart.sh [DIR]     (default ~/.cache/dilu/cudart)
set -euo pipefail
dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/dilu/cudart}"
want=(nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-runtime==13.2.86 nvidia-nvml-dev-cu12==12.9.79)
stamp="$dir/.installed"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "${want[*]}" ]]; then
  python3 -m pip --version >/dev/null 2>&1 || {
    echo "install-cudart: python3 -m pip is required to fetch the CUDA runtime wheels" >&2
    exit 1
  }
  rm -rf "$dir"
  mkdir -p "$dir"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$dir" "${want[@]}" >&2
  echo "${want[*]}" >"$stamp"
fi
for lib in libcudart.so.12 libcudart.so.13; do
  if [[ -z "$(find "$dir" -name "$lib" -print -quit)" ]]; then
    echo "install-cudart: $lib missing under $dir" >&2
    exit 1
  fi
done
echo "$dir"
