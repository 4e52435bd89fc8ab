#!/usr/bin/env bash
# Real-GPU checks, for hosts with an NVIDIA GPU and driver: the same programs
# the simulated tests use, run against the real libcuda.so.1 directly and
# under `dilu run`, plus PyTorch when it is installed. Results are printed
# and written to bench/results/gpu-check-<UTC time>.md. The interposer's
# overhead on the real driver (launch, alloc+free; `real-overhead compare`)
# goes to bench/results/real-overhead.md with the GPU model and driver version.
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
