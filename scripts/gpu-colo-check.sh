#!/usr/bin/env bash
# Co-location on a real NVIDIA GPU, judged as the field judges (the rows and
# columns of scripts/bench.sh field, which measures them on simgpu): the
# co-location bench's 120 req/s inference shape, a primary (demo-tenant
# serve: Poisson arrivals at 120 req/s, 4 kernels of ~200 µs per request,
# SLO 10 ms) beside two batch fillers with deep queues (cudarc-loop, ~1 ms
# and ~0.5 ms kernels), for --seconds each. Rows: the primary alone; time
# slicing (no limiter); HAMi-core (when HAMI_VGPU names its libvgpu.so:
# CUDA_DEVICE_SM_LIMIT 50 for the primary, 25 per filler), XSched and TGS
# (when XSCHED_DIR and TGS_DIR name their builds); the node
# manager's static controller (SM requests 40/20/20, limits 100); dilu at
# defaults with the SLO declared (`dilu run --colo primary --slo-ms 10`,
# `--colo filler`) and without it; and dilu-colo tuned as in the co-location
# bench (DILU_COLO_TOLERANCE=2ms). A real GPU has no kernel trace: a
# filler's device time is its kernels per second over its rate alone (alone
# it keeps the device busy), the primary's is requests × 4 × its kernel time.
# Columns: the primary's p50 and p99 over alone's, harvest (the fillers'
# device time over the time the primary leaves idle alone), device busy,
# SLO violations. Writes bench/results/gpu-colocation.md.
#
#   scripts/gpu-colo-check.sh [--seconds S]   (default 8, the field bench's length)
#
#   DILU_BIN=DIR   prebuilt release binaries (dilu, libdilu_interposer.so,
#                  cudarc-loop, demo-tenant); default target/release, built by cargo
#   HAMI_VGPU=PATH HAMi-core's libvgpu.so for its row (scripts/peers.sh builds one)
#   XSCHED_DIR=DIR XSched's Level 1 install (bin/xserver, lib/libcuda.so): its
#                  row, the primary at priority 1 and fillers at 0 under HPF
#   TGS_DIR=DIR    TGS's hijack builds (high/, low/): its row, the primary on
#                  the high-priority library, fillers on the low one
#   CUDA_DRIVER_LIB=PATH  the driver library those two open (default: ldconfig's libcuda.so.1)
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=8
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "gpu-colo-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-colo-check: no NVIDIA GPU/driver found; scripts/bench.sh colocation runs the shapes on simgpu" >&2
  exit 2
fi
if [ -n "${DILU_BIN:-}" ]; then
  bin=$DILU_BIN
else
  cargo build --release -p dilu-nodemgr -p dilu-interposer -p dilu-tests --bins --lib || exit 1
  bin=target/release
fi
for f in dilu libdilu_interposer.so cudarc-loop demo-tenant; do
  [ -e "$bin/$f" ] || { echo "gpu-colo-check: $bin/$f is missing" >&2; exit 2; }
done
out=bench/results/gpu-colocation.md
# FMAs per thread for a ~100 µs kernel of 1320 × 128 threads, from
# gpu-calibrate's jitter table (as scripts/gpu-sm-check.sh does).
i100=$(awk -F'|' '/^\| 100 \|/ { gsub(/ /, ""); if ($5 > 0) printf "%d", $3 * 100 / $5; exit }' \
  bench/results/gpu-calibration.md 2>/dev/null)
i100=${i100:-9400}
primary=("$bin/demo-tenant" serve --rate 120 --kernels 4 --blocks 1320 --iters $((i100 * 2))
  --seconds "$seconds" --on-ms 1000 --off-ms 0 --slo-ms 10 --stream new)
filler_args=("--blocks 1320 --iters $((i100 * 10)) --depth 32" "--blocks 1320 --iters $((i100 * 5)) --depth 32")
rate() { grep -o '"kernels_per_second":[0-9.]*' | head -1 | cut -d: -f2; }
field() { grep -o "\"$1\":[0-9.]*" | head -1 | cut -d: -f2; }
scratch=$(mktemp -d /tmp/gpu-colo.XXXXXX)
trap '[ -n "${GPU_COLO_KEEP:-}" ] || rm -rf "$scratch"' EXIT

echo "== fillers alone" >&2
alone_rate=()
for i in 0 1; do
  read -ra args <<< "${filler_args[$i]}"
  alone_rate[$i]=$("$bin/cudarc-loop" --seconds 3 --json "${args[@]}" | rate)
done
# The primary's kernel time: its kernels back to back, alone.
kernel_us=$("$bin/cudarc-loop" --seconds 2 --json --blocks 1320 --iters $((i100 * 2)) --depth 1000 | rate |
  awk '{ if ($1 > 0) printf "%.1f", 1e6 / $1 }')

hami=${HAMI_VGPU:-}
xsched=${XSCHED_DIR:-}
tgs=${TGS_DIR:-}
# The real driver, which XSched's shim and TGS's hijack open by path.
driver=${CUDA_DRIVER_LIB:-$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / { print $NF; exit }')}
driver=$(readlink -f "${driver:-/usr/lib/x86_64-linux-gnu/libcuda.so.1}")
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else print "?" }'; }

# The primary alone, for the ratios: p50, p99 and its device time (%).
alone_p50="" alone_p99="" alone_busy=""

# config NAME MODE: one row. MODE: alone, none (time slicing), hami, or a
# node-manager setting: static, dilu-colo (tuned), defaults-slo, defaults.
config() {
  local name=$1 mode=$2 dir nm="" p f0="" f1="" run=() spec_p=() spec_f=() colo_p=() colo_f=() i args
  local tag
  tag=$(printf '%s' "$name" | tr -c 'A-Za-z0-9._-' '-')
  dir=$scratch/$tag
  mkdir -p "$dir"
  echo "== $name" >&2
  case $mode in
    alone | none | hami | xsched | tgs) ;;
    *)
      : >"$dir/none.toml"
      local controller=()
      case $mode in
        static) controller=(--controller static) ;;
        dilu-colo) controller=(--controller dilu-colo) ;;
      esac
      "$bin/dilu" nodemgr --config "$dir/none.toml" --socket "$dir/nm.sock" --run-dir "$dir/run" \
        --metrics "" "${controller[@]}" >"$dir/nm.log" 2>&1 &
      nm=$!
      for _ in $(seq 100); do [ -S "$dir/nm.sock" ] && break; sleep 0.1; done
      run=("$bin/dilu" run)
      spec_p=(--tenant "gpu-colo-$$-${mode}-p")
      spec_f=()
      case $mode in
        static | dilu-colo)
          spec_p+=(--sm-request 40 --sm-limit 100 --class latency --slo-ms 10)
          spec_f=(--class batch --sm-request 20 --sm-limit 100) ;;
        defaults-slo) spec_p+=(--slo-ms 10) ;;
      esac
      case $mode in
        dilu-colo | defaults-slo | defaults) colo_p=(--colo primary); colo_f=(--colo filler) ;;
      esac
      ;;
  esac
  # The tuned row's tolerance only; the defaults rows run as a user would.
  local env_common=(env -u DILU_COLO_TOLERANCE DILU_NODEMGR_SOCKET="$dir/nm.sock" DILU_COLO_GROUP="gpu-colo-$$-$tag")
  [ "$mode" = dilu-colo ] && env_common+=(DILU_COLO_TOLERANCE=2ms)
  peer() { # peer SHARE TENANT PRIORITY: a program's environment under the row's peer
    case $mode in
      hami) printf '%s\n' LD_PRELOAD="$hami" CUDA_DEVICE_SM_LIMIT="$1" \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$dir/$2.cache" LIBCUDA_LOG_LEVEL=0 ;;
      xsched) printf '%s\n' LD_LIBRARY_PATH="$xsched/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        XSCHED_SCHEDULER=GLB XSCHED_AUTO_XQUEUE=ON XSCHED_AUTO_XQUEUE_LEVEL=1 \
        XSCHED_AUTO_XQUEUE_PRIORITY="$3" XSCHED_CUDA_LIB="$driver" CUXTRA_CUDA_LIB="$driver" \
        XSCHED_IPC_NAMESPACE="gpu-colo-$$" ;;
      tgs) printf '%s\n' LD_LIBRARY_PATH="$tgs/$([ "$3" = 1 ] && echo high || echo low):$scratch/tgs-driver:$(dirname "$driver")" ;;
    esac
  }
  local server=""
  if [ "$mode" = xsched ]; then
    local port=$((40000 + RANDOM % 20000))
    XSCHED_IPC_NAMESPACE="gpu-colo-$$" "$xsched/bin/xserver" HPF "$port" >"$dir/xserver.log" 2>&1 &
    server=$!
    sleep 2
  fi
  if [ "$mode" = tgs ]; then
    # TGS's hijack is linked against libcuda.so.450.51.06 and opens the
    # driver and NVML under the version in /proc/driver/nvidia/version.
    mkdir -p /etc/gsharing "$scratch/tgs-driver"
    local version nvml_lib
    nvml_lib=$(readlink -f "$(dirname "$driver")/libnvidia-ml.so.1")
    version=$(awk '/^NVRM/ { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+(\.[0-9]+)+$/) { print $i; exit } }' /proc/driver/nvidia/version 2>/dev/null)
    for v in 450.51.06 $version; do
      ln -sf "$driver" "$scratch/tgs-driver/libcuda.so.$v"
      ln -sf "$nvml_lib" "$scratch/tgs-driver/libnvidia-ml.so.$v"
    done
  fi
  local peer_p peer_f
  if [ "$mode" != alone ]; then
    # The fillers' rate counts while the primary runs: from 1.5 s after
    # they start (the primary starts at 1 s) to its planned end.
    local window
    window=$(awk -v t="$(date +%s.%N)" -v s="$seconds" 'BEGIN { printf "%.3f,%.3f", t + 1.5, t + 1 + s }')
    for i in 0 1; do
      read -ra args <<< "${filler_args[$i]}"
      mapfile -t peer_f < <(peer 25 "f$i" 0)
      local tenant=()
      [ -n "$nm" ] && tenant=(--tenant "gpu-colo-$$-${mode}-f$i")
      # A peer that hangs costs a bounded time, not the run.
      timeout -k 5 $((seconds + 30)) "${env_common[@]}" "${peer_f[@]}" "${run[@]}" "${tenant[@]}" "${spec_f[@]}" "${colo_f[@]}" ${run:+--} \
        "$bin/cudarc-loop" --seconds $((seconds + 2)) --json --alloc-on-default-stream --window "$window" "${args[@]}" >"$dir/f$i.out" 2>&1 &
      [ "$i" = 0 ] && f0=$! || f1=$!
    done
    # The primary joins a GPU whose batch work is running, as a server does.
    sleep 1
  fi
  mapfile -t peer_p < <(peer 50 p 1)
  timeout -k 5 $((seconds + 30)) "${env_common[@]}" "${peer_p[@]}" "${run[@]}" "${spec_p[@]}" "${colo_p[@]}" ${run:+--} "${primary[@]}" \
    >"$dir/p.out" 2>"$dir/p.err" &
  p=$!
  wait $p $f0 $f1
  [ -n "$nm" ] && { kill "$nm"; wait "$nm" 2>/dev/null; }
  [ -n "$server" ] && { kill -INT "$server"; sleep 1; kill -9 "$server" 2>/dev/null; wait "$server" 2>/dev/null; }
  local requests p50 p99 violations share0=0 share1=0 primary_busy harvest
  requests=$(field requests <"$dir/p.out")
  p50=$(field p50_ms <"$dir/p.out")
  p99=$(field p99_ms <"$dir/p.out")
  violations=$(field slo_violation_rate <"$dir/p.out")
  if [ -z "$requests" ]; then
    echo "| $name | did not run: $(tail -c 300 "$dir/p.err" | tr '\n|' '  ') | | | | |"
    return
  fi
  if [ "$mode" != alone ]; then
    share0=$(awk -v a="$(field window_kernels_per_second <"$dir/f0.out")" -v b="${alone_rate[0]}" 'BEGIN { printf "%.1f", (b > 0 ? 100 * a / b : 0) }')
    share1=$(awk -v a="$(field window_kernels_per_second <"$dir/f1.out")" -v b="${alone_rate[1]}" 'BEGIN { printf "%.1f", (b > 0 ? 100 * a / b : 0) }')
  fi
  primary_busy=$(awk -v r="$requests" -v k="${kernel_us:-0}" -v s="$seconds" 'BEGIN { printf "%.1f", 100 * r * 4 * k / 1e6 / s }')
  if [ "$mode" = alone ]; then
    alone_p50=$p50 alone_p99=$p99 alone_busy=$primary_busy
    printf '| alone | %s ms | %s ms | (idle %.1f%%) | %.1f%% | %.2f%% |\n' "$p50" "$p99" \
      "$(awk -v b="$primary_busy" 'BEGIN { print 100 - b }')" "$primary_busy" "$(awk -v v="$violations" 'BEGIN { print 100 * v }')"
    return
  fi
  harvest=$(awk -v a="$share0" -v b="$share1" -v busy="$alone_busy" 'BEGIN { idle = 100 - busy; printf "%.1f%%", (idle > 0 ? 100 * (a + b) / idle : 0) }')
  awk -v n="$name" -v p50="$(ratio "$p50" "$alone_p50")" -v p99="$(ratio "$p99" "$alone_p99")" -v h="$harvest" \
    -v busy="$(awk -v p="$primary_busy" -v a="$share0" -v b="$share1" 'BEGIN { print p + a + b }')" -v v="${violations:-0}" \
    'BEGIN { printf "| %s | %s | %s | %s | %.1f%% | %.2f%% |\n", n, p50, p99, h, busy, 100 * v }'
}

{
  echo "# Co-location on a real GPU, judged as the field judges"
  echo
  echo "Command: \`scripts/gpu-colo-check.sh --seconds $seconds\`$([ -n "$hami" ] && echo " with HAMI_VGPU")$([ -n "$xsched" ] && echo ", XSCHED_DIR")$([ -n "$tgs" ] && echo ", TGS_DIR"), $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)."
  echo "Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores."
  echo
  echo "The co-location bench's 120 req/s inference shape: a primary with Poisson arrivals, 4"
  echo "kernels of $kernel_us µs per request (1320 blocks × $((i100 * 2)) FMAs), SLO 10 ms; two batch"
  echo "fillers with deep queues (kernels of 10× and 5× 100 µs' FMAs), $seconds s per row, one row"
  echo "after another; the fillers start 1 s before the primary (\`cudarc-loop --alloc-on-default-stream\`,"
  echo "the primary on a stream of its own: XSched Level 1 needs both). A filler's device time: its"
  echo "kernels per second while the primary runs (\`--window\`) over its rate alone (${alone_rate[0]}"
  echo "and ${alone_rate[1]} kernels/s); the primary's: requests × 4 × its kernel time alone. Harvest:"
  echo "the fillers' device time over the time the primary leaves idle alone. Device busy: the"
  echo "three added (a real GPU has no kernel trace). Latency: arrival to the request's last"
  echo "kernel's end, measured by the program; SLO violations counted in every row."
  echo "Rows: see the script's header (\`scripts/gpu-colo-check.sh --help\`)."
  echo
  echo "| row | p50 vs alone | p99 vs alone | harvest | device busy | SLO violations |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  config alone alone
  config "time slicing" none
  if [ -n "$hami" ]; then config HAMi-core hami; fi
  if [ -n "$xsched" ]; then config "XSched" xsched; fi
  if [ -n "$tgs" ]; then config "TGS" tgs; fi
  config "static shares" static
  config "dilu with SLO" defaults-slo
  config "dilu without SLO" defaults
  config "dilu-colo, tolerance 2 ms" dilu-colo
} | tee "$out"
echo "gpu-colo-check: results in $out" >&2
