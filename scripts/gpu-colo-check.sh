#!/usr/bin/env bash
# Work-conserving co-location on a real NVIDIA GPU: the co-location bench's
# 120 req/s inference shape (scripts/bench.sh colocation measures it on
# simgpu, by its kernel trace) with the real driver's time slicing. A
# primary (demo-tenant serve: Poisson arrivals at 120 req/s, 4 kernels of
# ~200 µs per request, SLO 10 ms, SM request 40%, limit 100%) beside two
# batch fillers with deep queues (cudarc-loop, ~1 ms and ~0.5 ms kernels,
# SM request 20%, limit 100% each), for --seconds each: with no limiter,
# and under the node manager's static, dilu and dilu-colo controllers
# (dilu-colo: `dilu run --colo`, the primary tolerating one filler kernel of
# delay, DILU_COLO_TOLERANCE=2ms, as in the bench). A real GPU has no kernel
# trace: a filler's share is its kernels per second over its rate alone,
# the primary's is requests × kernels × kernel time. Writes
# bench/results/gpu-colocation.md.
#
#   scripts/gpu-colo-check.sh [--seconds S]   (default 8, the issue's length)
#
#   DILU_BIN=DIR   prebuilt release binaries (dilu, libdilu_interposer.so,
#                  cudarc-loop, demo-tenant); default target/release, built by cargo
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
  --seconds "$seconds" --on-ms 1000 --off-ms 0 --slo-ms 10)
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

# config NAME CONTROLLER|none|alone: one row of the table.
config() {
  local name=$1 controller=$2 dir nm="" p f0="" f1="" spec_p=() spec_f=() colo_p=() colo_f=()
  dir=$scratch/${name// /-}
  mkdir -p "$dir"
  echo "== $name" >&2
  if [ "$controller" != none ] && [ "$controller" != alone ]; then
    : >"$dir/none.toml"
    "$bin/dilu" nodemgr --config "$dir/none.toml" --socket "$dir/nm.sock" --run-dir "$dir/run" \
      --metrics "" --controller "$controller" >"$dir/nm.log" 2>&1 &
    nm=$!
    for _ in $(seq 100); do [ -S "$dir/nm.sock" ] && break; sleep 0.1; done
    spec_p=(--tenant "gpu-colo-$$-p" --sm-request 40 --sm-limit 100 --class latency --slo-ms 10)
    spec_f=(--class batch --sm-request 20 --sm-limit 100)
    [ "$controller" = dilu-colo ] && { colo_p=(--colo primary); colo_f=(--colo filler); }
  fi
  export DILU_NODEMGR_SOCKET=$dir/nm.sock DILU_COLO_GROUP=gpu-colo-$$-${name// /-} DILU_COLO_TOLERANCE=2ms
  local run=()
  [ -n "$nm" ] && run=("$bin/dilu" run)
  if [ -n "$nm" ]; then
    "${run[@]}" "${spec_p[@]}" "${colo_p[@]}" -- "${primary[@]}" >"$dir/p.out" 2>"$dir/p.err" &
  else
    "${primary[@]}" >"$dir/p.out" 2>"$dir/p.err" &
  fi
  p=$!
  if [ "$controller" != alone ]; then
    for i in 0 1; do
      read -ra args <<< "${filler_args[$i]}"
      if [ -n "$nm" ]; then
        "${run[@]}" --tenant "gpu-colo-$$-f$i" "${spec_f[@]}" "${colo_f[@]}" -- \
          "$bin/cudarc-loop" --seconds $((seconds + 1)) --json "${args[@]}" >"$dir/f$i.out" 2>&1 &
      else
        "$bin/cudarc-loop" --seconds $((seconds + 1)) --json "${args[@]}" >"$dir/f$i.out" 2>&1 &
      fi
      [ "$i" = 0 ] && f0=$! || f1=$!
    done
  fi
  wait $p $f0 $f1
  [ -n "$nm" ] && { kill "$nm"; wait "$nm" 2>/dev/null; }
  local requests p99 violations share0=0 share1=0 primary_share
  requests=$(field requests <"$dir/p.out")
  p99=$(field p99_ms <"$dir/p.out")
  violations=$(field slo_violation_rate <"$dir/p.out")
  if [ "$controller" != alone ]; then
    share0=$(awk -v a="$(rate <"$dir/f0.out")" -v b="${alone_rate[0]}" 'BEGIN { printf "%.1f", (b > 0 ? 100 * a / b : 0) }')
    share1=$(awk -v a="$(rate <"$dir/f1.out")" -v b="${alone_rate[1]}" 'BEGIN { printf "%.1f", (b > 0 ? 100 * a / b : 0) }')
  fi
  primary_share=$(awk -v r="${requests:-0}" -v k="${kernel_us:-0}" -v s="$seconds" 'BEGIN { printf "%.1f", 100 * r * 4 * k / 1e6 / s }')
  awk -v n="$name" -v ps="$primary_share" -v a="$share0" -v b="$share1" -v p99="${p99:-?}" -v v="${violations:-0}" \
    'BEGIN { printf "| %s | %.1f%% | %.1f%% + %.1f%% | %s | %.2f%% |\n", n, ps + a + b, a, b, p99, 100 * v }'
}

{
  echo "# Work-conserving co-location on a real GPU"
  echo
  echo "Command: \`scripts/gpu-colo-check.sh --seconds $seconds\`, $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)."
  echo "Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores."
  echo
  echo "The co-location bench's 120 req/s inference shape (\`bench/results/colocation.md\` has it on"
  echo "simgpu): a primary with Poisson arrivals, 4 kernels of $kernel_us µs per request (1320 blocks ×"
  echo "$((i100 * 2)) FMAs), SLO 10 ms, SM request 40%; two batch fillers with deep queues (kernels"
  echo "of 10× and 5× 100 µs' FMAs, SM request 20% each), $seconds s per configuration, one after"
  echo "another. Filler share: kernels per second over the filler's rate alone (alone: ${alone_rate[0]}"
  echo "and ${alone_rate[1]} kernels/s). Primary share: requests × 4 × its kernel time alone."
  echo "Device busy: the three added (a real GPU has no kernel trace). Latency: arrival to the"
  echo "request's last kernel's end, measured by the program."
  echo
  echo "| configuration | device busy | filler shares | primary p99 (ms) | SLO violations |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  config alone alone
  config "no limiter" none
  config static static
  config dilu dilu
  config dilu-colo dilu-colo
} | tee "$out"
echo "gpu-colo-check: results in $out" >&2
