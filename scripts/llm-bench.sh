#!/usr/bin/env bash
# LLM serving beside fine-tuning on one simulated GPU: vLLM's OpenAI server
# (unmodified) judged by TTFT and TPOT against itself alone, the filler by
# its throughput against alone, for time slicing, static shares, HAMi-core
# (a build named by DILU_PEER_HAMI) and dilu with and without an SLO; the
# same with bursty arrivals; two servers on one GPU; writes
# bench/results/llm.md (scripts/llm_bench.py says how it measures).
#
#   scripts/bench.sh llm [-- --seconds 90 --rate 1.0 --seed 1 --rows "server alone,..."]
#
# Not part of CI (too heavy): it installs vLLM, PyTorch and NVIDIA's
# libraries (several GB) into a virtual environment (DILU_VLLM_VENV, default
# ~/.cache/dilu/vllm-venv) the first time, as scripts/vllm-sim-check.sh
# does, and each row starts a vLLM engine (about a minute on 2 cores): about
# 50 minutes in all.
set -euo pipefail
cd "$(dirname "$0")/.."
# The header above is the help; asking for it installs and builds nothing.
usage() { sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
for arg in "$@"; do
  if [[ "$arg" == -h || "$arg" == --help ]]; then
    usage
    echo
    exec python3 scripts/llm_bench.py --help
  fi
done
venv="${DILU_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dilu/vllm-venv}"
python="$venv/bin/python"
if ! "$python" -c 'import vllm' >/dev/null 2>&1; then
  echo "== installing vllm into $venv (several GB, once)" >&2
  [[ -x "$python" ]] || python3 -m venv "$venv"
  "$python" -m pip install --disable-pip-version-check --quiet vllm
fi
echo "== building dilu and simgpu (release)" >&2
cargo build --release --quiet -p dilu-nodemgr -p dilu-interposer -p simgpu -p simgpu-nvml
# `dilu run --sim` makes the folder where libcuda.so.1 and libnvidia-ml.so.1
# are simgpu's; the HAMi-core row and the busy sampler use it directly.
target/release/dilu run --sim -- true
exec "$python" scripts/llm_bench.py --dilu target/release/dilu --python "$python" \
  --driver-dir target/release/simgpu-driver --out bench/results/llm.md "$@"
