#!/usr/bin/env bash
# SM-time caps on a real NVIDIA GPU, by completed work (a real GPU has no
# kernel trace): each workload shape of the SM-time benchmark runs alone
# uncapped, alone at caps of 30 and 70 with dilu's NVML usage feedback on
# and off, and as a 30/70 pair; cells are throughput relative to the same
# shape alone and uncapped. It also records what NVML's per-process samples
# say about a process whose kernels keep the GPU busy
# (scripts/nvml_process_samples.py), the input of the usage feedback.
# Writes bench/results/gpu-sm.md.
#
# With --sim it runs the same shapes on simgpu (its defaults, each run on an
# instance of its own, pairs sharing one) and writes bench/results/sim-sm.md,
# each cell beside the real GPU's from bench/results/gpu-sm.md: how faithful
# simgpu's sharing model is, measured the way a real GPU allows.
#
#   scripts/gpu-sm-check.sh [--seconds S] [--sim] [--nvml-only]   (default 4 s per run)
#
# --nvml-only   only what NVML's samples say (one process, then two at once,
#               with and without dilu), to bench/results/gpu-nvml.md
#               (sim-nvml.md with --sim)
#   DILU_BIN=DIR   prebuilt release binaries (dilu, libdilu_interposer.so,
#                  cudarc-loop); default target/release, built by cargo
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=4
sim=0
nvml_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --sim) sim=1; shift ;;
    --nvml-only) nvml_only=1; shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "gpu-sm-check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ "$sim" = 0 ] && { ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu-sm-check: no NVIDIA GPU/driver found; --sim runs the same shapes on simgpu" >&2
  exit 2
fi
if [ -n "${DILU_BIN:-}" ]; then
  bin=$DILU_BIN
else
  cargo build --release -p dilu-nodemgr -p dilu-interposer -p dilu-tests -p simgpu -p simgpu-nvml --bins --lib || exit 1
  bin=target/release
fi
out=bench/results/gpu-sm.md
[ "$nvml_only" = 1 ] && out=bench/results/gpu-nvml.md
sim_flag=()
if [ "$sim" = 1 ]; then
  out=bench/results/sim-sm.md
  [ "$nvml_only" = 1 ] && out=bench/results/sim-nvml.md
  sim_flag=(--sim)
  # The simulated driver and NVML under their real names, for the direct runs.
  libdir=$(mktemp -d /tmp/gpu-sm-sim.XXXXXX)
  trap 'rm -rf "$libdir"; rm -f /dev/shm/simgpu-$(id -u)-gpu-sm-$$-*' EXIT
  for name in libcuda.so.1 libcuda.so; do ln -s "$(cd "$bin" && pwd)/libsimgpu.so" "$libdir/$name"; done
  ln -s "$(cd "$bin" && pwd)/libsimgpu_nvml.so" "$libdir/libnvidia-ml.so.1"
  export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# instance NAME: the simgpu instance a run uses (a real GPU ignores it).
instance() { export SIMGPU_INSTANCE="gpu-sm-$$-$1"; }

# FMAs per thread for a ~100 µs kernel of 1320 × 128 threads: from
# gpu-calibrate's jitter table when it is there (iters × 100 / median µs).
i100=$(awk -F'|' '/^\| 100 \|/ { gsub(/ /, ""); if ($5 > 0) printf "%d", $3 * 100 / $5; exit }' \
  bench/results/gpu-calibration.md 2>/dev/null)
i100=${i100:-9400}
i20=$((i100 / 5))
# A real GPU's kernel length follows the FMA count; simgpu's the grid.
k100="--blocks 1320 --iters $i100"; k20="--blocks 1320 --iters $i20"; k1000="--blocks 1320 --iters $((i100 * 10))"
k3000="--blocks 1320 --iters $((i100 * 30))"
[ "$sim" = 1 ] && { k100="--blocks 1320"; k20="--blocks 264"; k1000="--blocks 13200"; k3000="--blocks 39600"; }
shapes=(
  "100 µs, sync every 4|$k100 --depth 4"
  "100 µs, sync every 1000|$k100 --depth 1000"
  "20 µs, sync every 1|$k20 --depth 1"
  "1 ms, never drains|$k1000 --depth never"
  "20 µs, 3 streams, never drains|$k20 --streams 3 --depth never"
  # Longer than a time slice (2.08 ms on an H100): preempted mid-kernel
  # whenever another process has work (a 4096² fp32 PyTorch matmul is 2.7 ms).
  "3 ms, sync every 10|$k3000 --depth 10"
)
rate() { grep -o '"kernels_per_second":[0-9.]*' | head -1 | cut -d: -f2; }
pct() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "?" }'; }
# capped FEEDBACK CAP TAG ARGS...: kernels/s of one capped process.
capped() {
  local feedback=$1 cap=$2 tag=$3; shift 3
  local ablate=
  if [ "$feedback" = off ]; then ablate=feedback; fi
  DILU_SM_ABLATE=$ablate "$bin/dilu" run "${sim_flag[@]}" --tenant "gpu-sm-$$-$tag" --sm "$cap" -- \
    "$bin/cudarc-loop" --seconds "$seconds" --json "$@" 2>/dev/null | rate
}

# The real GPU the --sim rows stand beside: the one gpu-sm.md was measured on.
reference=$(sed -n 's/^GPU: NVIDIA \([A-Za-z0-9]*\).*/\1/p' bench/results/gpu-sm.md 2>/dev/null | head -1)
reference=${reference:-real GPU}
flags="--seconds $seconds"
[ "$sim" = 1 ] && flags="$flags --sim"
[ "$nvml_only" = 1 ] && flags="$flags --nvml-only"
{
  if [ "$nvml_only" = 1 ]; then
    echo "# What NVML's per-process samples say"
    echo
    echo "Command: \`scripts/gpu-sm-check.sh $flags\`, $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  elif [ "$sim" = 1 ]; then
    echo "# SM-time caps on simgpu beside the $reference, by completed work"
    echo
    echo "Command: \`scripts/gpu-sm-check.sh $flags\`, $(date -u +%Y-%m-%dT%H:%M:%SZ)."
    echo "Device: simgpu with its defaults (\`simgpu/README.md\`, *Calibration*); each shape's second"
    echo "row is the $reference's, copied from bench/results/gpu-sm.md."
  else
    echo "# SM-time caps on a real GPU, by completed work"
    echo
    echo "Command: \`scripts/gpu-sm-check.sh $flags\`, $(date -u +%Y-%m-%dT%H:%M:%SZ)."
  fi
  [ "$sim" = 0 ] && echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)."
  echo "Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores."
  echo
  echo "Kernels: \`cudarc-loop\` FMA kernels of 1320 blocks × 128 threads; $i100 FMAs per thread ≈ 100 µs here."
  if [ "$nvml_only" = 0 ]; then
    echo "Cells: kernels per second as % of the same shape alone and uncapped (which keeps the GPU"
    echo "close to fully busy, so a cap of C should give close to C%). Feedback: dilu's NVML usage"
    echo "feedback (off: \`DILU_SM_ABLATE=feedback\`). Pair: two processes at 30 and 70, each % of its own alone rate;"
    echo "the same pair without dilu (plain time slicing) beside it."
  fi
  echo
  if [ "$nvml_only" = 0 ]; then
  echo "| shape | alone k/s | 30, feedback on | 30, off | 70, on | 70, off | pair 30/70, on | pair 30/70, off | pair without dilu |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for i in "${!shapes[@]}"; do
    IFS='|' read -r name args <<< "${shapes[$i]}"
    read -ra args <<< "$args"
    instance "alone-$i"
    alone=$("$bin/cudarc-loop" --seconds "$seconds" --json "${args[@]}" 2>/dev/null | rate)
    row="| $name | ${alone:-?}"
    for cap in 30 70; do
      for feedback in on off; do
        instance "a$i-$cap-$feedback"
        row="$row | $(pct "$(capped "$feedback" "$cap" "a$i-$cap-$feedback" "${args[@]}")" "$alone")"
      done
    done
    for feedback in on off; do
      instance "p$i-$feedback"
      fa=$(mktemp)
      capped "$feedback" 30 "p$i-30-$feedback" "${args[@]}" > "$fa" &
      b=$(capped "$feedback" 70 "p$i-70-$feedback" "${args[@]}")
      wait
      row="$row | $(pct "$(cat "$fa")" "$alone") / $(pct "$b" "$alone")"
      rm -f "$fa"
    done
    instance "p$i-none"
    fa=$(mktemp)
    "$bin/cudarc-loop" --seconds "$seconds" --json "${args[@]}" 2>/dev/null | rate > "$fa" &
    b=$("$bin/cudarc-loop" --seconds "$seconds" --json "${args[@]}" 2>/dev/null | rate)
    wait
    row="$row | $(pct "$(cat "$fa")" "$alone") / $(pct "$b" "$alone")"
    rm -f "$fa"
    echo "$row |"
    if [ "$sim" = 1 ]; then
      grep -F "| $name |" bench/results/gpu-sm.md 2>/dev/null | head -1 | sed "s/^| $name |/| ↳ $reference |/"
    fi
  done
  fi
  echo
  echo "## What NVML's per-process samples say"
  echo
  echo "\`scripts/nvml_process_samples.py\` polling every 50 ms while one process runs the first shape"
  echo "(alone uncapped, then under \`dilu run --sm 50\`), then while two run it at once (without dilu,"
  echo "then at 30/70): sample count and spacing, each sample's smUtil, and the busy fraction they add"
  echo "up to as usage_feedback.rs counts them, beside the program's rate."
  echo
  IFS='|' read -r name args <<< "${shapes[0]}"
  read -ra args <<< "$args"
  if python3 -c "import pynvml" 2>/dev/null; then
    echo '```'
    instance nvml-alone
    echo "alone: $(python3 scripts/nvml_process_samples.py --seconds 3 -- "$bin/cudarc-loop" --seconds 3 --json "${args[@]}")"
    instance nvml-50
    echo "--sm 50: $(python3 scripts/nvml_process_samples.py --seconds 3 -- "$bin/dilu" run "${sim_flag[@]}" --tenant "gpu-sm-$$-nvml" --sm 50 -- "$bin/cudarc-loop" --seconds 3 --json "${args[@]}")"
    # Two processes at once: what each one's samples say while they share
    # the device by time slices, without dilu and at 30/70.
    for setting in none "30 70"; do
      instance "nvml-pair-${setting// /-}"
      fa=$(mktemp)
      if [ "$setting" = none ]; then
        python3 scripts/nvml_process_samples.py --seconds 3 -- "$bin/cudarc-loop" --seconds 3 --json "${args[@]}" > "$fa" &
        b=$(python3 scripts/nvml_process_samples.py --seconds 3 -- "$bin/cudarc-loop" --seconds 3 --json "${args[@]}")
      else
        python3 scripts/nvml_process_samples.py --seconds 3 -- "$bin/dilu" run "${sim_flag[@]}" --tenant "gpu-sm-$$-nvml-30" --sm 30 -- \
          "$bin/cudarc-loop" --seconds 3 --json "${args[@]}" > "$fa" &
        b=$(python3 scripts/nvml_process_samples.py --seconds 3 -- "$bin/dilu" run "${sim_flag[@]}" --tenant "gpu-sm-$$-nvml-70" --sm 70 -- \
          "$bin/cudarc-loop" --seconds 3 --json "${args[@]}")
      fi
      wait
      echo "pair ($setting), first: $(cat "$fa")"
      echo "pair ($setting), second: $b"
      rm -f "$fa"
    done
    echo '```'
  else
    echo "skipped: python3 cannot import pynvml (nvidia-ml-py)"
  fi
  if [ "$nvml_only" = 1 ]; then
    exit 0
  fi
  echo
  echo "## The usage feedback's own account"
  echo
  echo "The first shape under \`--sm 70\` with \`DILU_LOG=dilu_interposer::sm_time::usage_feedback=trace\`: the"
  echo "device time NVML's samples gave (busy) and what launches were charged (charged), summed over"
  echo "every settlement (one per new NVML sample of the process)."
  echo
  log=$(mktemp)
  instance log
  k=$(DILU_LOG=dilu_interposer::sm_time::usage_feedback=trace "$bin/dilu" run "${sim_flag[@]}" --tenant "gpu-sm-$$-log" --sm 70 -- \
    "$bin/cudarc-loop" --seconds "$seconds" --json "${args[@]}" 2>"$log" | rate)
  echo '```'
  awk -v k="$k" '/device time settled/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "busy_ns") b += kv[2]; if (kv[1] == "charged_ns") c += kv[2] } n++ }
    END { printf "%d settlements; busy %.3f s, charged %.3f s, busy/charged %.2f; %s kernels/s\n", n, b / 1e9, c / 1e9, (c > 0 ? b / c : 0), k
          if (n == 0) print "(no settlement logged: NVML never listed the process alone, or the log target above is stale)" }' "$log"
  echo '```'
  rm -f "$log"
} | tee "$out"
echo "gpu-sm-check: results in $out" >&2
