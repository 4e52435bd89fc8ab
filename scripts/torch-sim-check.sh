#!/usr/bin/env bash
# PyTorch (its CUDA wheel and NVIDIA's packages, unmodified) on simgpu under
# `dilu run --sim`, step by step; writes bench/results/torch-sim.md.
#
# Not part of CI: it installs PyTorch and its NVIDIA libraries (several GB)
# into a virtual environment (DILU_TORCH_VENV, default
# ~/.cache/dilu/torch-venv) the first time.
#
#   scripts/torch-sim-check.sh [SECONDS_OF_LOOP]    (default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
# The header above is the help; asking for it installs and builds nothing.
usage() { sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
esac
seconds="${1:-8}"
if [[ ! "$seconds" =~ ^[1-9][0-9]*$ || $# -gt 1 ]]; then
  echo "torch-sim-check: takes one argument, the loop's seconds (a whole number), got '$*' (see --help)" >&2
  exit 2
fi
venv="${DILU_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dilu/torch-venv}"
python="$venv/bin/python"
if ! "$python" -c 'import torch' >/dev/null 2>&1; then
  echo "== installing torch into $venv (several GB, once)"
  [[ -x "$python" ]] || python3 -m venv "$venv"
  "$python" -m pip install --disable-pip-version-check --quiet torch
fi
echo "== building dilu and simgpu"
cargo build --workspace --quiet
dilu=target/debug/dilu
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
budget_bytes=$((4 << 30))
instance="torch-sim-$$"

echo "== functional checks under dilu run --sim --mem 4GiB"
SIMGPU_INSTANCE="$instance" SIMGPU_LOG_ERRORS=1 CUBLASLT_LOG_LEVEL=2 SIMGPU_TRACE="$work/checks-trace.jsonl" \
  "$dilu" run --sim --mem 4GiB -- "$python" scripts/torch_sim_check.py checks "$budget_bytes" \
  >"$work/checks.jsonl" 2>"$work/checks.err" || true

echo "== two elementwise loops at --sm 30 and --sm 70 for ${seconds}s"
for share in 30 70; do
  SIMGPU_INSTANCE="$instance-sm" SIMGPU_TRACE="$work/trace.jsonl" \
    "$dilu" run --sim --sm "$share" -- "$python" scripts/torch_sim_check.py loop "$seconds" \
    >"$work/loop-$share.jsonl" 2>"$work/loop-$share.err" &
done
wait
uid="$(id -u)"
rm -f "/dev/shm/simgpu-$uid-$instance" "/dev/shm/simgpu-$uid-$instance-sm"

"$python" - "$work" "$seconds" >bench/results/torch-sim.md <<'PY'
import json, os, subprocess, sys
work, seconds = sys.argv[1], sys.argv[2]
import torch

def lines(name):
    path = os.path.join(work, name)
    if not os.path.exists(path):
        return []
    out = []
    for l in open(path):
        l = l.strip()
        if l.startswith("{"):
            try:
                out.append(json.loads(l))
            except ValueError:
                pass
    return out

NOISE = ("Failed to initialize NumPy", "_conversion_method_template")

def tail(name, n):
    """The last n distinct stderr lines, runs of one line collapsed (xN)."""
    path = os.path.join(work, name)
    text = open(path).read().splitlines() if os.path.exists(path) else []
    runs = []
    for line in text:
        if any(x in line for x in NOISE):
            continue
        if runs and runs[-1][0] == line:
            runs[-1][1] += 1
        else:
            runs.append([line, 1])
    return [l if k == 1 else f"{l}   (x{k})" for l, k in runs[-n:]]

commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print("<!-- Written by scripts/torch-sim-check.sh; do not edit by hand. -->")
print("# PyTorch on simgpu under `dilu run --sim`")
print()
print(f"Written by `scripts/torch-sim-check.sh {seconds}` at commit {commit}.")
pkgs = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json"], capture_output=True, text=True).stdout
wanted = [p for p in json.loads(pkgs or "[]") if p["name"].lower() in (
    "torch", "nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "cuda-toolkit", "nvidia-nccl-cu13")]
print("Versions: Python " + sys.version.split()[0] + ", " + ", ".join(f"{p['name']} {p['version']}" for p in wanted) + ".")
print()
print("simgpu computes no kernel results: tensors computed on the device hold")
print("whatever the memory held; only copies, memory, errors, launches and")
print("timing are meaningful.")
print()
print("## Functional checks (`--mem 4GiB`)")
print()
print("| step | result | detail |")
print("|---|---|---|")
first_failure = None
for r in lines("checks.jsonl"):
    mark = "ok" if r["ok"] else "**FAILED**"
    if not r["ok"] and first_failure is None:
        first_failure = r
    print(f"| {r['step']} | {mark} | {r['detail'].replace('|', '/')} |")
print()
if first_failure:
    print(f"First failure: **{first_failure['step']}**: {first_failure['detail']}")
else:
    print("Every step passed.")
print()
cublaslt = [l.strip() for l in open(os.path.join(work, "checks.jsonl")) if "[cublasLt]" in l]
if cublaslt:
    print("cuBLASLt's log (level 2, on stdout):")
    print()
    print("```")
    for l in cublaslt[-6:]:
        print(l[:240])
    print("```")
    print()
gemm_words = ("gemm", "nvjet", "cublas", "cutlass", "splitK")
gemms = [r for r in lines("checks-trace.jsonl") if any(w in r.get("name", "") for w in gemm_words)]
if gemms:
    print("cuBLAS kernels the matmul steps launched (simgpu's trace). simgpu's")
    print("cost model gives each kernel ceil(blocks / 132 SMs) x `SIMGPU_WAVE_NS`")
    print("(10 us) of device time: it does not read the GEMM's sizes, so a kernel's")
    print("time follows its grid, not its K dimension.")
    print()
    print("| kernel | blocks | device time |")
    print("|---|---|---|")
    for r in gemms:
        print(f"| `{r['name'][:110]}` | {r['blocks']} | {(r['end_ns'] - r['start_ns']) / 1000:.1f} us |")
    print()
print("Last lines the process wrote to stderr (simgpu's failed calls with")
print("`SIMGPU_LOG_ERRORS=1`; repeated lines collapsed):")
print()
print("```")
for l in tail("checks.err", 12):
    print(l[:200])
print("```")
print()
print(f"## SM-time split (`--sm 30` and `--sm 70`, {seconds} s of elementwise kernels each)")
print()
records = [r for r in lines("trace.jsonl") if "pid" in r]
spans = {}
for r in records:
    s = spans.setdefault(r["pid"], [r["start_ns"], r["end_ns"]])
    s[0] = min(s[0], r["start_ns"]); s[1] = max(s[1], r["end_ns"])
for share in (30, 70):
    for r in lines(f"loop-{share}.jsonl"):
        print(f"- `--sm {share}`: {r['detail']}")
    for l in tail(f"loop-{share}.err", 3):
        print(f"  - stderr: `{l[:160]}`")
if len(spans) == 2:
    lo = max(s[0] for s in spans.values()); hi = min(s[1] for s in spans.values())
    busy = {}
    for pid in spans:
        iv = sorted((max(r["start_ns"], lo), min(r["end_ns"], hi)) for r in records if r["pid"] == pid)
        total, reach = 0, 0
        for a, b in iv:
            a = max(a, reach)
            if b > a:
                total += b - a; reach = b
        busy[pid] = total
    whole = sum(busy.values()) or 1
    shares = sorted(v / whole for v in busy.values())
    print()
    print(f"Device-time shares in the common window ({(hi - lo) / 1e9:.2f} s) from simgpu's trace: "
          f"{shares[0]*100:.1f}% and {shares[1]*100:.1f}% (target 30% / 70%), {len(records)} trace rows.")
else:
    print()
    print(f"The trace holds {len(spans)} process(es): no split to compute.")
PY
echo "== wrote bench/results/torch-sim.md"
cat bench/results/torch-sim.md
