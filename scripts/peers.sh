#!/usr/bin/env bash
# Side by side with HAMi-core on one simulated GPU (simgpu + its simulated
# NVML): builds HAMi-core's libvgpu.so from a checkout you point at, then runs
# the same suites under dilu, under HAMi-core and with no limiter, in one run,
# and writes bench/results/peers.md.
#
#   HAMI_CORE_SRC=/path/to/HAMi-core scripts/bench.sh peers [-- --seconds S]
#
# HAMI_CORE_SRC  a checkout of https://github.com/Project-HAMi/HAMi-core (not
#                vendored, never downloaded by this script)
# PEERS_CACHE    where the headers and the built library go (default
#                target/peers-cache). HAMi-core needs cuda.h and nvml.h: this
#                script runs `pip download` for the PyPI wheels
#                nvidia-cuda-runtime-cu12 (include/cuda.h) and
#                nvidia-nvml-dev-cu12 (include/nvml.h) into PEERS_CACHE once.
# --seconds S    length of each SM-share run (default 5)
#
# libvgpu.so is compiled with gcc like HAMi-core's build.sh (its defines:
# DLSYM_HOOK_ENABLE, MULTIPROCESS_LIMIT_ENABLE, HOOK_MEMINFO_ENABLE,
# HOOK_NVML_ENABLE), with -O2, and used as HAMi-core documents it:
# LD_PRELOAD plus CUDA_REDIRECT, CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_SM_LIMIT
# and one CUDA_DEVICE_MEMORY_SHARED_CACHE file per tenant (container).
# Needs: gcc, python3 with pip, the release build (scripts/bench.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=5
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "peers: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
: "${HAMI_CORE_SRC:?peers: set HAMI_CORE_SRC to a HAMi-core checkout (https://github.com/Project-HAMi/HAMi-core)}"
cache=${PEERS_CACHE:-target/peers-cache}
release=target/release
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

# --- headers from PyPI wheels, once
if [ ! -f "$cache/include/cuda.h" ] || [ ! -f "$cache/include/nvml.h" ]; then
  echo "== pip download nvidia-cuda-runtime-cu12 nvidia-nvml-dev-cu12 -> $cache" >&2
  python3 -m pip download --quiet --no-deps -d "$cache/wheels" nvidia-cuda-runtime-cu12 nvidia-nvml-dev-cu12
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
  gcc -shared -fPIC -O2 -D_GNU_SOURCE -w -I"$cache/include" -I"$src" -I"$vgpu_dir/config" \
    -o "$vgpu" "$src"/libvgpu.c "$src"/utils.c "$src"/log_utils.c "$src"/nvml/nvml_entry.c \
    "$src"/nvml/hook.c "$src"/cuda/*.c "$src"/allocator/allocator.c \
    "$src"/multiprocess/multiprocess_memory_limit.c "$src"/multiprocess/multiprocess_utilization_watcher.c \
    -lpthread -ldl
fi

# --- the simulated driver and NVML under their real names
libdir="$release/peers-lib"
mkdir -p "$libdir"
ln -sf "$(pwd)/$release/libsimgpu.so" "$libdir/libcuda.so.1"
ln -sf "$(pwd)/$release/libsimgpu.so" "$libdir/libcuda.so"
ln -sf "$(pwd)/$release/libsimgpu_nvml.so" "$libdir/libnvidia-ml.so.1"

work=$(mktemp -d /tmp/dilu-peers.XXXXXX)
trap 'rm -rf "$work"; rm -f /dev/shm/simgpu-$(id -u)-peers-$$-* /dev/shm/dilu-$(id -u)-peers-$$-*' EXIT

# run LIMITER TENANT SM MEM PROGRAM ARGS...: one process of TENANT under
# LIMITER (none|dilu|hami) with an SM share (percent or -) and a memory limit
# (bytes or -), on the simgpu instance $SIMGPU_INSTANCE; prints its stdout.
run() {
  local limiter=$1 tenant="peers-$$-$2" sm=$3 mem=$4; shift 4
  case $limiter in
    none)
      LD_LIBRARY_PATH="$libdir" "$@" 2>/dev/null ;;
    dilu)
      local args=(run --sim --tenant "$tenant")
      [ "$sm" != - ] && args+=(--sm "$sm")
      [ "$mem" != - ] && args+=(--mem "$mem")
      "$release/dilu" "${args[@]}" -- "$@" 2>/dev/null ;;
    hami)
      local env=(LD_LIBRARY_PATH="$libdir" LD_PRELOAD="$vgpu" CUDA_REDIRECT="$vgpu"
                 CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/$tenant.cache" LIBCUDA_LOG_LEVEL=0)
      [ "$sm" != - ] && env+=(CUDA_DEVICE_SM_LIMIT="$sm")
      [ "$mem" != - ] && env+=(CUDA_DEVICE_MEMORY_LIMIT="$((mem / 1048576))m")
      env "${env[@]}" "$@" 2>/dev/null ;;
  esac
}

export SIMGPU_LOG_ERRORS=0
results="$work/results.jsonl"
echo "== per-call cost and memory view (peer-probe)" >&2
for limiter in none dilu hami; do
  export SIMGPU_INSTANCE="peers-$$-probe-$limiter"
  out=$(run "$limiter" "probe-$limiter" - $((1 << 30)) "$release/peer-probe" | grep '^{')
  echo "{\"suite\":\"probe\",\"limiter\":\"$limiter\",\"sm\":null,\"r\":$out}" >> "$results"
  out=$(run "$limiter" "probe-sm-$limiter" 30 $((1 << 30)) "$release/peer-probe" | grep '^{')
  echo "{\"suite\":\"probe\",\"limiter\":\"$limiter\",\"sm\":30,\"r\":$out}" >> "$results"
done

loop=("$release/cudarc-loop" --seconds "$seconds" --depth 1000 --json)
echo "== SM shares (cudarc-loop, 100 us kernels, ${seconds}s)" >&2
export SIMGPU_INSTANCE="peers-$$-alone"
out=$(run none alone - - "${loop[@]}" | grep '^{')
echo "{\"suite\":\"alone\",\"limiter\":\"none\",\"r\":$out}" >> "$results"
for split in "30 70" "10 90"; do
  read -r a b <<< "$split"
  for limiter in dilu hami none; do
    export SIMGPU_INSTANCE="peers-$$-sm-$limiter-$a"
    export SIMGPU_TRACE="$work/trace-$limiter-$a.jsonl"
    sa=$a; sb=$b
    [ "$limiter" = none ] && { sa=-; sb=-; }
    # Two tenants (two containers, for HAMi-core: two shared caches).
    run "$limiter" "sm-$limiter-$a-a" "$sa" - "${loop[@]}" > "$work/a.out" &
    pa=$!
    run "$limiter" "sm-$limiter-$a-b" "$sb" - "${loop[@]}" > "$work/b.out"
    wait $pa
    unset SIMGPU_TRACE
    echo "{\"suite\":\"split\",\"limiter\":\"$limiter\",\"want\":[$a,$b],\"trace\":\"$work/trace-$limiter-$a.jsonl\",\"a\":$(grep '^{' "$work/a.out"),\"b\":$(grep '^{' "$work/b.out")}" >> "$results"
  done
done

python3 scripts/peers_report.py "$results" "$commit" "scripts/peers.sh --seconds $seconds" > bench/results/peers.md
echo "bench/results/peers.md written" >&2
