#!/usr/bin/env bash
# vLLM (from PyPI, unmodified) on simgpu under `dilu run --sim`, step by
# step; writes bench/results/vllm-sim.md.
#
# Not part of CI (too heavy): it installs vLLM, PyTorch and NVIDIA's
# libraries (several GB) into a virtual environment (DILU_VLLM_VENV, default
# ~/.cache/dilu/vllm-venv) the first time, and each step starts a vLLM
# engine (minutes on a small machine).
#
#   scripts/vllm-sim-check.sh
#
# Steps: offline generation eager and with CUDA graphs under --mem 4GiB
# (NVML in the parent and vLLM's free-memory profile must show the budget,
# the KV cache must fit in it); a utilisation the budget cannot hold must be
# refused at start; then two vLLM processes at once on one simulated GPU,
# each with --mem 2GiB, at --sm 30 and --sm 70, with CUDA graphs.
#
# Two vLLM settings have nothing to do with dilu and are set for every step:
# VLLM_USE_FLASHINFER_SAMPLER=0 (FlashInfer's sampler wants nvcc) and
# VLLM_USE_V2_MODEL_RUNNER=0 (the V2 runner waits on bookkeeping computed on
# the device, which simgpu does not compute).
set -euo pipefail
cd "$(dirname "$0")/.."
# The header above is the help; asking for it installs and builds nothing.
usage() { sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
case "${1:-}" in
  "") ;;
  -h | --help) usage; exit 0 ;;
  *) echo "vllm-sim-check: takes no arguments, got '$1' (see --help)" >&2; exit 2 ;;
esac
venv="${DILU_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dilu/vllm-venv}"
python="$venv/bin/python"
if ! "$python" -c 'import vllm' >/dev/null 2>&1; then
  echo "== installing vllm into $venv (several GB, once)"
  [[ -x "$python" ]] || python3 -m venv "$venv"
  "$python" -m pip install --disable-pip-version-check --quiet vllm
fi
echo "== building dilu and simgpu"
cargo build --quiet -p dilu-nodemgr -p dilu-interposer -p simgpu -p simgpu-nvml
dilu=target/debug/dilu
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
uid="$(id -u)"
pair_tokens=96
pair_wave=1ms
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_USE_V2_MODEL_RUNNER=0
unset DILU_MEM_LIMIT DILU_SM_LIMIT DILU_TENANT CUDA_VISIBLE_DEVICES

# step NAME INSTANCE DILU_FLAGS -- SCRIPT_ARGS: one vLLM run, output in $work/NAME.*
step() {
  local name="$1" instance="$2" flags="$3"
  shift 4
  echo "== $name: dilu run --sim $flags -- vllm_sim_check.py $*"
  SIMGPU_INSTANCE="$instance" SIMGPU_TRACE="$work/$name.trace.jsonl" \
    timeout 1200 "$dilu" run --sim $flags -- "$python" scripts/vllm_sim_check.py "$@" \
    >"$work/$name.out" 2>"$work/$name.err" || echo "$?" >"$work/$name.rc"
}

step eager "vllm-sim-$$-1" "--mem 4GiB" -- eager 0.5 8
step graphs "vllm-sim-$$-2" "--mem 4GiB" -- graphs 0.5 8
step refused "vllm-sim-$$-3" "--mem 4GiB" -- eager 0.95 8
# Kernels of $pair_wave (instead of simgpu's 10 us) make the device, not
# Python, the bottleneck of generation, so that the shares bind; both
# generate at once (a barrier), however long each engine took to start.
echo "== two at once: --mem 2GiB --sm 30 and --mem 2GiB --sm 70 (graphs, kernels of $pair_wave)"
mkdir "$work/barrier"
export SIMGPU_WAVE_NS="$pair_wave"
step sm30 "vllm-sim-$$-4" "--mem 2GiB --sm 30" -- graphs 0.5 "$pair_tokens" "$work/barrier" 2 &
step sm70 "vllm-sim-$$-4" "--mem 2GiB --sm 70" -- graphs 0.5 "$pair_tokens" "$work/barrier" 2 &
wait
unset SIMGPU_WAVE_NS
# simgpu removes an instance's file when its last process leaves; these go
# only if one was killed.
rm -f /dev/shm/simgpu-"$uid"-vllm-sim-$$-*

"$python" scripts/vllm_sim_report.py "$work" "$pair_wave" >bench/results/vllm-sim.md
cat bench/results/vllm-sim.md
