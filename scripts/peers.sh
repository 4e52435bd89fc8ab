#!/usr/bin/env bash
# Side by side with HAMi-core on one simulated GPU (simgpu + its simulated
# NVML): builds HAMi-core's libvgpu.so from a checkout you point at, then runs
# the same suites under dilu, under HAMi-core and with no limiter, in one run,
# and writes bench/results/peers.md. Suites: per-call cost and the memory view
# of one process (peer-probe); every allocation path, processes of one tenant
# racing for its budget, a SIGKILLed holder, the cuMemGetInfo/NVML view with
# several processes, start-up beside 0/16/64 processes of the tenant
# (peer-suites); SM shares 30/70 and 10/90 over the SM-time benchmark's
# workload shapes (cudarc-loop, simgpu's kernel trace).
#
#   HAMI_CORE_SRC=/path/to/HAMi-core scripts/bench.sh peers [-- --seconds S]
#
# HAMI_CORE_SRC  a checkout of https://github.com/Project-HAMi/HAMi-core (not
#                vendored, never downloaded by this script)
# PEERS_CACHE    where the headers and the built library go (default
#                target/peers-cache). HAMi-core needs cuda.h and nvml.h:
#                scripts/build-peers.sh, which builds it, takes them from
#                ~/.cache/dilu/cudart or the PyPI wheels nvidia-cuda-runtime-cu12
#                and nvidia-nvml-dev-cu12.
# --seconds S    length of each SM-share run (default 5)
# --only SUITES  comma-separated subset of: probe,paths,concurrent,sigkill,view,
#                startup,sm (default all; the report has only those sections)
# --runs R       process starts timed per setting in the startup suite (default 50)
#
# libvgpu.so is compiled by scripts/build-peers.sh with gcc like HAMi-core's
# build.sh (its defines: DLSYM_HOOK_ENABLE, MULTIPROCESS_LIMIT_ENABLE,
# HOOK_MEMINFO_ENABLE, HOOK_NVML_ENABLE), with -O2, and used as HAMi-core documents it:
# LD_PRELOAD plus CUDA_REDIRECT, CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_SM_LIMIT
# and one CUDA_DEVICE_MEMORY_SHARED_CACHE file per tenant (container).
# Needs: gcc, python3 with pip, the release build (scripts/bench.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=5
only=probe,paths,concurrent,sigkill,view,startup,sm
runs=50
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "peers: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
: "${HAMI_CORE_SRC:?peers: set HAMI_CORE_SRC to a HAMi-core checkout (https://github.com/Project-HAMi/HAMi-core)}"
cache=${PEERS_CACHE:-target/peers-cache}
release=target/release
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

# --- libvgpu.so, built by scripts/build-peers.sh
commit=$(git -C "$HAMI_CORE_SRC" rev-parse HEAD 2>/dev/null || echo unknown)
PEERS_CACHE=$cache scripts/build-peers.sh --only hami --out "$cache/peers"
vgpu=$(. "$cache/peers/env.sh" && echo "$DILU_PEER_HAMI")

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
# (bytes or -), on the simgpu instance $SIMGPU_INSTANCE. Processes it starts
# inherit the limiter (the same tenant).
run() {
  local limiter=$1 tenant="peers-$$-$2" sm=$3 mem=$4; shift 4
  case $limiter in
    none)
      env LD_LIBRARY_PATH="$libdir" "$@" ;;
    dilu)
      local args=(run --sim --tenant "$tenant")
      [ "$sm" != - ] && args+=(--sm "$sm")
      [ "$mem" != - ] && args+=(--mem "$mem")
      exec_env "$release/dilu" "${args[@]}" -- "$@" ;;
    hami)
      local env=(LD_LIBRARY_PATH="$libdir" LD_PRELOAD="$vgpu" CUDA_REDIRECT="$vgpu"
                 CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/$tenant.cache" LIBCUDA_LOG_LEVEL=0)
      [ "$sm" != - ] && env+=(CUDA_DEVICE_SM_LIMIT="$sm")
      [ "$mem" != - ] && env+=(CUDA_DEVICE_MEMORY_LIMIT="$((mem / 1048576))m")
      env "${env[@]}" "$@" ;;
  esac
}
# dilu's own knobs for one suite (DILU_* variables), passed through `dilu run`.
exec_env() { env "${dilu_env[@]}" "$@"; }
dilu_env=()

export SIMGPU_LOG_ERRORS=0
results="$work/results.jsonl"
: > "$results"
# record KEYS LIMITER TENANT SM MEM PROGRAM ARGS...: runs one process (see
# run) and appends {KEYS..., "limiter", "rc", "out": [its JSON lines],
# "err": its last stderr line} to the results: a crash or a refusal to start
# is a finding, not a reason to stop.
record() {
  local keys=$1 limiter=$2 out err rc=0
  shift
  out=$(mktemp "$work/out.XXXXXX"); err=$(mktemp "$work/err.XXXXXX")
  run "$@" > "$out" 2> "$err" < /dev/null || rc=$?
  python3 - "$keys" "$limiter" "$rc" "$out" "$err" "$results" <<'PY'
import fcntl, json, sys
keys, limiter, rc, out, err, results = sys.argv[1:7]
row = json.loads(keys)
row["limiter"], row["rc"] = limiter, int(rc)
row["out"] = [json.loads(l) for l in open(out) if l.startswith("{")]
tail = [l.strip() for l in open(err, errors="replace") if l.strip()]
row["err"] = tail[-1][:300] if tail else ""
# The two sides of a pair finish together: one line per record, whole.
with open(results, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(json.dumps(row) + "\n")
PY
  rm -f "$out" "$err"
}
wants() { [[ ",$only," == *",$1,"* ]]; }
limiters=(dilu hami none)
mib=1048576

if wants probe; then
  echo "== per-call cost and memory view (peer-probe)" >&2
  for limiter in "${limiters[@]}"; do
    export SIMGPU_INSTANCE="peers-$$-probe-$limiter"
    record '{"suite":"probe","sm":null}' "$limiter" "probe-$limiter" - $((1 << 30)) "$release/peer-probe"
    record '{"suite":"probe","sm":30}' "$limiter" "probe-sm-$limiter" 30 $((1 << 30)) "$release/peer-probe"
  done
fi

if wants paths; then
  echo "== every allocation path against a 1 GiB limit (peer-suites paths)" >&2
  for path in $("$release/peer-suites" paths --path list); do
    for limiter in "${limiters[@]}"; do
      tag="paths-$limiter-${path//[^A-Za-z0-9]/-}"
      export SIMGPU_INSTANCE="peers-$$-$tag"
      record "{\"suite\":\"paths\",\"path\":\"$path\"}" "$limiter" "$tag" - $((1 << 30)) \
        "$release/peer-suites" paths --path "$path" --limit $((1 << 30))
    done
  done
fi

if wants concurrent; then
  # dilu's per-process context allowance is set to 0 here, so both count
  # only the pieces and the sum is comparable with the limit.
  echo "== 8 processes of one tenant racing for a 1 GiB budget (peer-suites concurrent)" >&2
  dilu_env=(DILU_CONTEXT_MEMORY=0)
  for round in 1 2 3; do
    for limiter in "${limiters[@]}"; do
      export SIMGPU_INSTANCE="peers-$$-race-$limiter-$round"
      record "{\"suite\":\"concurrent\",\"round\":$round}" "$limiter" "race-$limiter-$round" - $((1 << 30)) \
        "$release/peer-suites" concurrent --procs 8 --piece $((16 * mib))
    done
  done
  dilu_env=()
fi

if wants sigkill; then
  echo "== a SIGKILLed holder's memory (peer-suites hold / grab)" >&2
  for limiter in "${limiters[@]}"; do
    export SIMGPU_INSTANCE="peers-$$-kill-$limiter"
    tenant="kill-$limiter"
    mkfifo "$work/$tenant.in"
    run "$limiter" "$tenant" - $((1 << 30)) "$release/peer-suites" hold --bytes $((640 * mib)) \
      < "$work/$tenant.in" > "$work/$tenant.out" 2>/dev/null &
    exec {hold_fd}> "$work/$tenant.in"
    for _ in $(seq 600); do grep -q ready "$work/$tenant.out" && break; sleep 0.1; done
    holder=$(awk '/^ready/ { print $2 }' "$work/$tenant.out")
    record '{"suite":"sigkill","when":"held"}' "$limiter" "$tenant" - $((1 << 30)) \
      "$release/peer-suites" grab --bytes $((512 * mib))
    [ -n "$holder" ] && kill -KILL "$holder"
    wait $! 2>/dev/null || true
    exec {hold_fd}>&-
    record "{\"suite\":\"sigkill\",\"when\":\"killed\",\"holder_started\":$([ -n "$holder" ] && echo true || echo false)}" \
      "$limiter" "$tenant" - $((1 << 30)) "$release/peer-suites" grab --bytes $((512 * mib)) --wait-s 10
  done
fi

if wants view; then
  echo "== the process view through cuMemGetInfo and NVML (peer-suites view)" >&2
  for limiter in "${limiters[@]}"; do
    export SIMGPU_INSTANCE="peers-$$-view-$limiter"
    pids=()
    for holder in "sibling $((256 * mib)) view-$limiter" "other $((512 * mib)) view-other-$limiter"; do
      read -r role bytes tenant <<< "$holder"
      mkfifo "$work/$tenant.in"
      run "$limiter" "$tenant" - $((1 << 30)) "$release/peer-suites" hold --bytes "$bytes" \
        < "$work/$tenant.in" > "$work/$tenant.out" 2>/dev/null &
      exec {fd}> "$work/$tenant.in"
      eval "fd_$role=$fd"
      for _ in $(seq 600); do grep -q ready "$work/$tenant.out" && break; sleep 0.1; done
      pids+=("\"$role\":$(awk '/^ready/ { print $2 }' "$work/$tenant.out" | grep . || echo null)")
    done
    record "{\"suite\":\"view\",$(IFS=,; echo "${pids[*]}")}" "$limiter" "view-$limiter" - $((1 << 30)) \
      "$release/peer-suites" view --bytes $((128 * mib))
    exec {fd_sibling}>&- {fd_other}>&-
    wait
  done
fi

if wants startup; then
  echo "== start-up with 0/16/64 other processes of the tenant (peer-suites startup, $runs runs)" >&2
  for others in 0 16 64; do
    for limiter in "${limiters[@]}"; do
      export SIMGPU_INSTANCE="peers-$$-start-$limiter-$others"
      record "{\"suite\":\"startup\",\"others\":$others}" "$limiter" "start-$limiter-$others" - $((64 << 30)) \
        "$release/peer-suites" startup --others "$others" --runs "$runs"
    done
  done
fi

if wants sm; then
  # The SM-time benchmark's workload matrix (tests/src/workload.rs), a shape
  # per row: name|cudarc-loop arguments. Kernel lengths on simgpu's cost
  # model: 264 blocks ≈ 20 µs, 1320 ≈ 100 µs, 13200 ≈ 1 ms.
  shapes=()
  for streams in 1 3; do
    for kernel in "20 µs:264" "100 µs:1320" "1 ms:13200"; do
      for k in 1 4 16 never; do
        s="streams"; [ "$streams" = 1 ] && s="stream"
        shapes+=("k=$k, ${kernel%%:*}, $streams $s|--blocks ${kernel##*:} --streams $streams --depth $k")
      done
    done
  done
  for k in 1 4 16 never; do
    shapes+=("k=$k, graphs of 10 × 20 µs|--blocks 264 --graph 10 --depth $k")
  done
  echo "== SM shares 30/70 and 10/90 over ${#shapes[@]} workload shapes (cudarc-loop, ${seconds}s each)" >&2
  for i in "${!shapes[@]}"; do
    IFS='|' read -r name shape_args <<< "${shapes[$i]}"
    read -ra shape_args <<< "$shape_args"
    loop=("$release/cudarc-loop" --seconds "$seconds" --json "${shape_args[@]}")
    export SIMGPU_INSTANCE="peers-$$-alone-$i"
    alone_trace="$work/trace-alone-$i.jsonl"
    SIMGPU_TRACE=$alone_trace record "{\"suite\":\"alone\",\"shape\":\"$name\",\"trace\":\"$alone_trace\"}" \
      none "alone-$i" - - "${loop[@]}"
    for setting in "dilu 30 70" "hami 30 70" "dilu 10 90" "hami 10 90" "none 50 50"; do
      read -r limiter a b <<< "$setting"
      sa=$a; sb=$b
      [ "$limiter" = none ] && { sa=-; sb=-; }
      export SIMGPU_INSTANCE="peers-$$-sm-$limiter-$a-$i"
      trace="$work/trace-$limiter-$a-$i.jsonl"
      # Two tenants (for HAMi-core, two containers: two shared caches).
      keys="\"suite\":\"split\",\"shape\":\"$name\",\"want\":[$a,$b],\"trace\":\"$trace\""
      SIMGPU_TRACE=$trace record "{$keys,\"side\":0}" "$limiter" "sm-$limiter-$a-$i-a" "$sa" - "${loop[@]}" &
      SIMGPU_TRACE=$trace record "{$keys,\"side\":1}" "$limiter" "sm-$limiter-$a-$i-b" "$sb" - "${loop[@]}"
      wait
    done
  done
fi

# Kept where a failed report can be looked into after the scratch directory goes.
cp "$results" "$cache/last-results.jsonl"
python3 scripts/peers_report.py "$results" "$commit" "scripts/peers.sh --seconds $seconds --runs $runs" > bench/results/peers.md
echo "bench/results/peers.md written" >&2
