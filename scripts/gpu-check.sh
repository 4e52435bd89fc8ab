#!/usr/bin/env bash
# Real-GPU checks, for hosts with an NVIDIA GPU and driver: the same programs
# the simulated tests use, run against the real libcuda.so.1 directly and
# under `dilu run`, plus PyTorch when it is installed. Results are printed
# and written to bench/results/gpu-check-<UTC time>.md. The interposer's
# overhead on the real driver (launch, alloc+free; `real-overhead compare`)
# goes to bench/results/real-overhead.md with the GPU model and driver version.
# It also makes the comparison simgpu cannot: two processes splitting the GPU
# 30/70 and 10/90 under NVIDIA MPS, under dilu and with time slicing.
set -uo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU/driver found (nvidia-smi -L failed); use scripts/test.sh on simgpu instead" >&2
  exit 2
fi
echo "== building (release)" >&2
cargo build --release --workspace --bins --lib || exit 1

bin=target/release
mkdir -p bench/results
report="bench/results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ).md"
calls=$(mktemp)
failures=0

overhead=bench/results/real-overhead.md

# Launch and alloc+free overhead, direct vs under the interposer, on the real
# driver (alternating processes; see bench/src/bin/real_overhead.rs).
real_overhead() {
  local table
  if ! table=$("$bin/real-overhead" compare --interposer "$PWD/$bin/libdilu_interposer.so" 2>&1); then
    echo "$table"
    return 1
  fi
  {
    echo "# Interposer overhead on the real NVIDIA driver"
    echo
    echo "Command: \`scripts/gpu-check.sh\` (\`real-overhead compare --interposer target/release/libdilu_interposer.so\`, release build), $(date -u +%Y-%m-%dT%H:%M:%SZ)."
    echo
    echo "GPU, driver version (\`nvidia-smi --query-gpu=name,driver_version\`):"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/- /'
    echo
    echo "Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "$table"
  } >"$overhead"
}

# run_pair LABEL "COMMAND A" "COMMAND B": both at once (word-split on
# purpose); prints the kernels each completed and their ratio. A real GPU
# has no kernel trace, so completed work is the measure.
run_pair() {
  local label=$1 fa fb pa ka kb
  fa=$(mktemp); fb=$(mktemp)
  $2 >"$fa" 2>/dev/null &
  pa=$!
  $3 >"$fb" 2>/dev/null
  wait "$pa"
  ka=$(grep -o '"kernels":[0-9]*' "$fa" | cut -d: -f2)
  kb=$(grep -o '"kernels":[0-9]*' "$fb" | cut -d: -f2)
  rm -f "$fa" "$fb"
  echo "$label: first ${ka:-?} kernels, second ${kb:-?}, work ratio $(awk -v a="${ka:-0}" -v b="${kb:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }')"
  [ -n "$ka" ] && [ -n "$kb" ]
}

# The comparison simgpu cannot make: two busy processes asked to split the
# GPU A/B under NVIDIA MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps the SMs a
# client may use, not its time), under dilu (`dilu run --sm`, a share of
# time) and with plain time slicing; target work ratio A/B.
split_three_ways() {
  local a=$1 b=$2 loop="$bin/cudarc-loop --seconds 10 --json" dir ok=0
  echo "target $a/$b: work ratio $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
  run_pair "time slicing" "$loop" "$loop" || ok=1
  run_pair "dilu --sm" "$bin/dilu run --tenant gpu-check-$$-a --sm $a -- $loop" \
    "$bin/dilu run --tenant gpu-check-$$-b --sm $b -- $loop" || ok=1
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "MPS: skipped (nvidia-cuda-mps-control not found)"
    return $ok
  fi
  dir=$(mktemp -d)
  # A private MPS daemon (its own pipe and log directories), stopped after.
  if CUDA_MPS_PIPE_DIRECTORY=$dir CUDA_MPS_LOG_DIRECTORY=$dir nvidia-cuda-mps-control -d; then
    run_pair "MPS" "env CUDA_MPS_PIPE_DIRECTORY=$dir CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$a $loop" \
      "env CUDA_MPS_PIPE_DIRECTORY=$dir CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$b $loop" || ok=1
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$dir nvidia-cuda-mps-control
  else
    echo "MPS: the control daemon did not start"; ok=1
  fi
  rm -rf "$dir"
  return $ok
}

section() { printf '\n## %s\n\n```\n' "$1"; }
endsection() { printf '```\n'; }
check() { # name, command...
  local name=$1; shift
  section "$name"
  if ! "$@" 2>&1; then echo "FAILED: $*"; failures=$((failures + 1)); fi
  endsection
}

{
  echo "# dilu gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  section "GPU"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  endsection
  section "interposer overhead on the real driver (real-overhead compare)"
  if real_overhead; then cat "$overhead"; else echo "FAILED: real-overhead compare"; failures=$((failures + 1)); fi
  endsection
  check "cudart-style client, real driver, direct" "$bin/cudart-client"
  check "cudart-style client under dilu run" env DILU_CALL_REPORT="$calls" "$bin/dilu" run -- "$bin/cudart-client"
  section "interposer call report"; cat "$calls"; endsection
  check "cudarc-loop direct (short kernels: launch-bound)" "$bin/cudarc-loop" --seconds 5 --blocks 132 --iters 10 --json
  check "cudarc-loop under dilu run (short kernels: launch-bound)" "$bin/dilu" run -- "$bin/cudarc-loop" --seconds 5 --blocks 132 --iters 10 --json
  check "SM split 30/70: MPS, dilu, time slicing" split_three_ways 30 70
  check "SM split 10/90: MPS, dilu, time slicing" split_three_ways 10 90
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    check "PyTorch direct" python3 scripts/torch_check.py
    check "PyTorch under dilu run" "$bin/dilu" run -- python3 scripts/torch_check.py
  else
    section "PyTorch"; echo "skipped: python3 cannot import torch with CUDA"; endsection
  fi
} > >(tee "$report") # not `| tee`: a pipeline would count failures in a subshell
wait $! # for tee to finish writing

rm -f "$calls"
echo "gpu-check: results in $report and $overhead ($failures failed)" >&2
[ "$failures" -eq 0 ]
