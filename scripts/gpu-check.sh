#!/usr/bin/env bash
# Real-GPU checks, for hosts with an NVIDIA GPU and driver: the same programs
# the simulated tests use, run against the real libcuda.so.1 directly and
# under `dilu run`, plus PyTorch when it is installed. Results are printed
# and written to bench/results/gpu-check-<UTC time>.md. The interposer's
# overhead on the real driver (launch in one process, both paths in turn:
# `real-overhead inprocess`; launch and alloc+free process against process:
# `real-overhead compare`) goes to bench/results/real-overhead.md with the
# GPU model and driver version.
# It also makes the comparison simgpu cannot: two processes splitting the GPU
# 30/70 and 10/90 under NVIDIA MPS, under dilu, under HAMi-core (when
# HAMI_VGPU names its libvgpu.so) and with time slicing, with cudarc-loop and
# with two PyTorch matmul loops. `gpu-calibrate all` measures what simgpu's
# model is set by (call costs, kernel gap, jitter, streams, time slices,
# hand-offs) and goes to bench/results/gpu-calibration.md.
#
#   scripts/gpu-check.sh                  builds (cargo) and runs everything
#   scripts/gpu-check.sh --overhead-only  only the interposer's overhead
#                                         (bench/results/real-overhead.md)
#   DILU_BIN=DIR scripts/gpu-check.sh     uses prebuilt release binaries in DIR
#                                         (dilu, libdilu_interposer.so, cudarc-loop,
#                                         cudart-client, real-overhead, gpu-calibrate)
#                                         on a GPU host without a Rust toolchain
#   HAMI_VGPU=PATH                        HAMi-core's libvgpu.so (scripts/peers.sh
#                                         builds one from HAMI_CORE_SRC) for the
#                                         side-by-side splits and memory check
set -uo pipefail
cd "$(dirname "$0")/.."
overhead_only=0
case ${1:-} in
  "") ;;
  --overhead-only) overhead_only=1 ;;
  -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
  *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU/driver found (nvidia-smi -L failed); use scripts/test.sh on simgpu instead" >&2
  exit 2
fi
if [ -n "${DILU_BIN:-}" ]; then
  bin=$DILU_BIN
  for f in dilu libdilu_interposer.so cudarc-loop cudart-client real-overhead gpu-calibrate; do
    [ -e "$bin/$f" ] || { echo "gpu-check: $bin/$f is missing (DILU_BIN must hold the release build)" >&2; exit 2; }
  done
else
  echo "== building (release)" >&2
  cargo build --release --workspace --bins --lib || exit 1
  bin=target/release
fi
hami=${HAMI_VGPU:-}
mkdir -p bench/results
report="bench/results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ).md"
calls=$(mktemp)
failures=0

overhead=bench/results/real-overhead.md
calibration=bench/results/gpu-calibration.md

# Launch and alloc+free overhead, direct vs under the interposer, on the real
# driver (alternating processes; see bench/src/bin/real_overhead.rs).
real_overhead() {
  local table sm_table in_table in_sm_table interposer
  interposer=$(cd "$bin" && pwd)/libdilu_interposer.so
  # Both paths in one process first: its figures do not depend on which
  # process got which launch cost.
  if ! in_table=$("$bin/real-overhead" inprocess --interposer "$interposer" --rounds 500 2>&1); then
    echo "$in_table"
    return 1
  fi
  if ! in_sm_table=$("$bin/real-overhead" inprocess --interposer "$interposer" --rounds 500 --sm 99 2>&1); then
    echo "$in_sm_table"
    return 1
  fi
  if ! table=$("$bin/real-overhead" compare --interposer "$interposer" 2>&1); then
    echo "$table"
    return 1
  fi
  if ! sm_table=$("$bin/real-overhead" compare --interposer "$interposer" --sm 99 2>&1); then
    echo "$sm_table"
    return 1
  fi
  {
    echo "# Interposer overhead on the real NVIDIA driver"
    echo
    echo "Command: \`scripts/gpu-check.sh\` or \`scripts/gpu-check.sh --overhead-only\` (\`real-overhead inprocess --interposer libdilu_interposer.so --rounds 500\`, \`real-overhead compare --interposer libdilu_interposer.so\`, each also with \`--sm 99\`; release build), $(date -u +%Y-%m-%dT%H:%M:%SZ)."
    echo
    echo "GPU, driver version (\`nvidia-smi --query-gpu=name,driver_version\`):"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/- /'
    echo
    echo "Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "## One process, both paths: memory budget only"
    echo
    echo "$in_table"
    echo
    echo "## One process, both paths: memory budget and an SM share"
    echo
    echo "$in_sm_table"
    echo
    echo "## Process against process: memory budget only"
    echo
    echo "A launch's cost differs from one process to the next by more than the interposer adds,"
    echo "so these medians move by hundreds of ns between runs; the tables above do not."
    echo
    echo "$table"
    echo
    echo "## Process against process: memory budget and an SM share (the launch path's budget check and sampling)"
    echo
    echo "$sm_table"
  } >"$overhead"
}
if [ "$overhead_only" = 1 ]; then
  real_overhead || { echo "gpu-check: real-overhead failed" >&2; exit 1; }
  cat "$overhead"
  exit 0
fi

# run_pair LABEL "COMMAND A" "COMMAND B" [KEY]: both at once (word-split on
# purpose); prints the work each completed (the JSON field KEY, default
# kernels) and their ratio. A real GPU has no kernel trace, so completed
# work is the measure (as HAMi-core reports its splits).
run_pair() {
  local label=$1 key=${4:-kernels} fa fb pa ka kb
  fa=$(mktemp); fb=$(mktemp)
  $2 >"$fa" 2>/dev/null &
  pa=$!
  $3 >"$fb" 2>/dev/null
  wait "$pa"
  ka=$(grep -o "\"$key\": *[0-9.]*" "$fa" | head -1 | sed 's/.*: *//')
  kb=$(grep -o "\"$key\": *[0-9.]*" "$fb" | head -1 | sed 's/.*: *//')
  rm -f "$fa" "$fb"
  echo "$label: first ${ka:-?} $key, second ${kb:-?}, work ratio $(awk -v a="${ka:-0}" -v b="${kb:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }')"
  [ -n "$ka" ] && [ -n "$kb" ]
}

# The comparison simgpu cannot make: two busy processes asked to split the
# GPU A/B under NVIDIA MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps the SMs a
# client may use, not its time), under dilu (`dilu run --sm`, a share of
# time) and with plain time slicing; target work ratio A/B.
split_ways() {
  local a=$1 b=$2 loop=${3:-"$bin/cudarc-loop --seconds 10 --json"} key=${4:-kernels} dir ok=0
  echo "target $a/$b: work ratio $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
  run_pair "time slicing" "$loop" "$loop" "$key" || ok=1
  run_pair "dilu --sm" "$bin/dilu run --tenant gpu-check-$$-a --sm $a -- $loop" \
    "$bin/dilu run --tenant gpu-check-$$-b --sm $b -- $loop" "$key" || ok=1
  if [ -n "$hami" ]; then
    # Two containers in HAMi-core's terms: one shared cache file each.
    dir=$(mktemp -d)
    run_pair "HAMi-core CUDA_DEVICE_SM_LIMIT" \
      "env LD_PRELOAD=$hami CUDA_DEVICE_SM_LIMIT=$a CUDA_DEVICE_MEMORY_SHARED_CACHE=$dir/a.cache $loop" \
      "env LD_PRELOAD=$hami CUDA_DEVICE_SM_LIMIT=$b CUDA_DEVICE_MEMORY_SHARED_CACHE=$dir/b.cache $loop" "$key" || ok=1
    rm -rf "$dir"
  fi
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "MPS: skipped (nvidia-cuda-mps-control not found)"
    return $ok
  fi
  dir=$(mktemp -d)
  # A private MPS daemon (its own pipe and log directories), stopped after.
  if CUDA_MPS_PIPE_DIRECTORY=$dir CUDA_MPS_LOG_DIRECTORY=$dir nvidia-cuda-mps-control -d; then
    run_pair "MPS" "env CUDA_MPS_PIPE_DIRECTORY=$dir CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$a $loop" \
      "env CUDA_MPS_PIPE_DIRECTORY=$dir CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$b $loop" "$key" || ok=1
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$dir nvidia-cuda-mps-control
  else
    echo "MPS: the control daemon did not start"; ok=1
  fi
  rm -rf "$dir"
  return $ok
}

# A request-style client (4 kernels of ~100 µs, then a synchronise) alone,
# directly and at caps of 30 and 70: its throughput relative to running
# alone uncapped (the cap is a share of wall-clock device time, so at most
# the cap when alone keeps the device busy).
request_alone() {
  local iters loop alone capped
  # The FMA count gpu-calibrate found for a 100 µs kernel of this grid.
  iters=$(awk -F'|' '/^\| 100 \|/ { gsub(/ /, "", $3); print $3; exit }' "$calibration" 2>/dev/null)
  loop="$bin/cudarc-loop --seconds 5 --json --blocks 1320 --iters ${iters:-11000} --depth 4"
  echo "kernels of 1320 blocks × ${iters:-11000} FMAs (≈ 100 µs)"
  alone=$($loop | grep -o '"kernels":[0-9]*' | cut -d: -f2)
  echo "alone, uncapped: ${alone:-?} kernels"
  [ -n "$alone" ] || return 1
  for cap in 30 70; do
    capped=$("$bin/dilu" run --tenant "gpu-check-$$-req" --sm "$cap" -- $loop | grep -o '"kernels":[0-9]*' | cut -d: -f2)
    echo "--sm $cap: ${capped:-?} kernels, $(awk -v a="${capped:-0}" -v b="$alone" 'BEGIN { printf "%.1f", 100 * a / b }')% of alone"
  done
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
  section "what simgpu is calibrated by (gpu-calibrate all)"
  if "$bin/gpu-calibrate" all >"$calibration.tmp"; then
    { echo "Command: \`scripts/gpu-check.sh\` (\`gpu-calibrate all\`), $(date -u +%Y-%m-%dT%H:%M:%SZ)."; echo; cat "$calibration.tmp"; } >"$calibration"
    cat "$calibration"
  else
    echo "FAILED: gpu-calibrate all"; failures=$((failures + 1))
  fi
  rm -f "$calibration.tmp"
  endsection
  section "interposer overhead on the real driver (real-overhead compare)"
  if real_overhead; then cat "$overhead"; else echo "FAILED: real-overhead compare"; failures=$((failures + 1)); fi
  endsection
  check "cudart-style client, real driver, direct" "$bin/cudart-client"
  check "cudart-style client under dilu run" env DILU_CALL_REPORT="$calls" "$bin/dilu" run -- "$bin/cudart-client"
  section "interposer call report"; cat "$calls"; endsection
  check "cudarc-loop direct (short kernels: launch-bound)" "$bin/cudarc-loop" --seconds 5 --blocks 132 --iters 10 --json
  check "cudarc-loop under dilu run (short kernels: launch-bound)" "$bin/dilu" run -- "$bin/cudarc-loop" --seconds 5 --blocks 132 --iters 10 --json
  check "SM split 30/70 (cudarc-loop): time slicing, dilu, HAMi-core, MPS" split_ways 30 70
  check "SM split 10/90 (cudarc-loop): time slicing, dilu, HAMi-core, MPS" split_ways 10 90
  check "request-style work alone (4 kernels, then a synchronise) at a cap" request_alone
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    check "PyTorch direct" python3 scripts/torch_check.py
    check "PyTorch under dilu run" "$bin/dilu" run -- python3 scripts/torch_check.py
    check "PyTorch memory limit 4 GiB (asks for 6 GiB): dilu" "$bin/dilu" run --mem 4GiB -- python3 scripts/torch_check.py --alloc-gib 6 --seconds 1
    if [ -n "$hami" ]; then
      hami_cache=$(mktemp -u)
      check "PyTorch memory limit 4 GiB (asks for 6 GiB): HAMi-core" env LD_PRELOAD="$hami" CUDA_DEVICE_MEMORY_LIMIT=4g \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$hami_cache" python3 scripts/torch_check.py --alloc-gib 6 --seconds 1
      rm -f "$hami_cache"
    fi
    check "SM split 30/70 of two PyTorch matmul loops" split_ways 30 70 "python3 scripts/torch_check.py --seconds 10" matmul_per_second
  else
    section "PyTorch"; echo "skipped: python3 cannot import torch with CUDA"; endsection
  fi
} > >(tee "$report") # not `| tee`: a pipeline would count failures in a subshell
wait $! # for tee to finish writing

rm -f "$calls"
echo "gpu-check: results in $report and $overhead ($failures failed)" >&2
[ "$failures" -eq 0 ]
