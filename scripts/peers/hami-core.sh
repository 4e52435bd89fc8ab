#!/usr/bin/env bash
# Builds HAMi-core's libvgpu.so (Project-HAMi/HAMi-core, Apache-2.0) from a
# checkout you point at and prints the built library's path on stdout
# (progress goes to stderr). Nothing of HAMi-core is in this repository and
# this script never downloads its code.
#
#   HAMI_CORE_SRC=/path/to/HAMi-core scripts/peers/hami-core.sh
#
# HAMI_CORE_SRC  a checkout of https://github.com/Project-HAMi/HAMi-core
#                (tried at commit 8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811,
#                committed 2026-06-30); a git checkout names the cache
#                folder by its commit, anything else is "unknown"
# PEERS_CACHE    where the headers and the built library go (default
#                target/peers-cache): PEERS_CACHE/hami-<commit>/libvgpu.so,
#                built once per commit. HAMi-core needs cuda.h and nvml.h:
#                this script runs `pip download` for the PyPI wheels
#                nvidia-cuda-runtime-cu12 (include/cuda.h) and
#                nvidia-nvml-dev-cu12 (include/nvml.h) into PEERS_CACHE once.
#
# libvgpu.so is compiled with gcc like HAMi-core's build.sh (its defines:
# DLSYM_HOOK_ENABLE, MULTIPROCESS_LIMIT_ENABLE, HOOK_MEMINFO_ENABLE,
# HOOK_NVML_ENABLE), with -O2. It is used as HAMi-core documents it:
# LD_PRELOAD and CUDA_REDIRECT naming it, CUDA_DEVICE_MEMORY_LIMIT,
# CUDA_DEVICE_SM_LIMIT and one CUDA_DEVICE_MEMORY_SHARED_CACHE file per
# tenant (container), with simgpu under the driver's names on
# LD_LIBRARY_PATH (scripts/peers.sh, bench/src/peers/hami_core.rs).
# Needs: gcc, python3 with pip (once, for the headers).
set -euo pipefail
cd "$(dirname "$0")/../.."

case ${1:-} in
  -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
  "") ;;
  *) echo "hami-core: unknown argument '$1'" >&2; exit 2 ;;
esac
: "${HAMI_CORE_SRC:?hami-core: set HAMI_CORE_SRC to a HAMi-core checkout (https://github.com/Project-HAMi/HAMi-core)}"
[ -f "$HAMI_CORE_SRC/src/libvgpu.c" ] || { echo "hami-core: $HAMI_CORE_SRC/src/libvgpu.c not found: HAMI_CORE_SRC is not a HAMi-core checkout" >&2; exit 1; }
cache=${PEERS_CACHE:-target/peers-cache}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

# --- headers from PyPI wheels, once
if [ ! -f "$cache/include/cuda.h" ] || [ ! -f "$cache/include/nvml.h" ]; then
  echo "== pip download nvidia-cuda-runtime-cu12 nvidia-nvml-dev-cu12 -> $cache" >&2
  python3 -m pip download --quiet --no-deps -d "$cache/wheels" nvidia-cuda-runtime-cu12 nvidia-nvml-dev-cu12 >&2
  mkdir -p "$cache/unpacked" "$cache/include"
  for w in "$cache"/wheels/*.whl; do python3 -m zipfile -e "$w" "$cache/unpacked"; done
  cp -r "$cache"/unpacked/nvidia/cuda_runtime/include/. "$cache/include/"
  find "$cache/unpacked" -name nvml.h -exec cp {} "$cache/include/" \;
fi

# --- libvgpu.so
commit=$(git -C "$HAMI_CORE_SRC" rev-parse HEAD 2>/dev/null || echo unknown)
vgpu_dir="$cache/hami-$commit"
vgpu="$vgpu_dir/libvgpu.so"
if [ ! -f "$vgpu" ]; then
  echo "== building HAMi-core $commit with gcc" >&2
  mkdir -p "$vgpu_dir/config"
  printf '#define DLSYM_HOOK_ENABLE 1\n#define MULTIPROCESS_LIMIT_ENABLE 1\n#define HOOK_MEMINFO_ENABLE 1\n#define HOOK_NVML_ENABLE 1\n' \
    > "$vgpu_dir/config/static_config.h"
  src=$HAMI_CORE_SRC/src
  # Built under a temporary name: an interrupted build leaves no library.
  gcc -shared -fPIC -O2 -D_GNU_SOURCE -w -I"$cache/include" -I"$src" -I"$vgpu_dir/config" \
    -o "$vgpu.tmp" "$src"/libvgpu.c "$src"/utils.c "$src"/log_utils.c "$src"/nvml/nvml_entry.c \
    "$src"/nvml/hook.c "$src"/cuda/*.c "$src"/allocator/allocator.c \
    "$src"/multiprocess/multiprocess_memory_limit.c "$src"/multiprocess/multiprocess_utilization_watcher.c \
    -lpthread -ldl
  mv "$vgpu.tmp" "$vgpu"
fi
echo "$vgpu"
