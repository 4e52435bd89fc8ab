#!/usr/bin/env bash
# A filler on a host whose CPUs are busy: how much of the simulated GPU a
# deep batch loop (cudarc-loop, 300 µs kernels, synchronising every 32)
# keeps busy while CPU-bound processes (one per core) run beside it, under
# `dilu run --colo filler` at its defaults (nice 19) against the same loop
# without co-location at nice 0 and at nice 19, and alone on an idle host.
# Medians of --rounds rounds, the rows interleaved within each round.
#
#   scripts/loaded-host.sh [--seconds S] [--rounds R] [--hogs N] [--out FILE] [--no-build]
#
# Writes bench/results/loaded-host.md (`scripts/bench.sh loaded-host`), or
# FILE.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=5
rounds=3
hogs=$(nproc)
build=yes
out=bench/results/loaded-host.md
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --hogs) hogs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build=; shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "loaded-host: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$seconds" "$rounds" "$hogs"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "loaded-host: --seconds, --rounds and --hogs take positive integers" >&2; exit 2; }
done
if [ -n "$build" ]; then
  cargo build --release -p simgpu -p simgpu-nvml -p dilu-interposer -p dilu-tests -p dilu-nodemgr --lib --bins
fi
bin=$PWD/target/release
scratch=$(mktemp -d)
hog_pids=()
stop_hogs() {
  if [ ${#hog_pids[@]} -gt 0 ]; then
    kill "${hog_pids[@]}" 2>/dev/null || true
    wait "${hog_pids[@]}" 2>/dev/null || true
  fi
  hog_pids=()
}
trap 'stop_hogs; rm -rf "$scratch"' EXIT

rows=("idle host, no co-location" "busy host, no co-location" "busy host, no co-location, nice 19" "busy host, dilu --colo filler (defaults)")
# run ROW_INDEX ROUND: the device busy share (%) of that row's run, in
# got[ROW_INDEX,ROUND].
declare -A got
run() {
  local row=$1 round=$2 group="loaded-$$-$1-$2"
  local trace=$scratch/$group.jsonl
  local prefix=() colo=()
  case $row in
    2) prefix=(nice -n 19) ;;
    3) colo=(--colo filler) ;;
  esac
  if [ "$row" -ne 0 ]; then
    for _ in $(seq "$hogs"); do
      bash -c 'while :; do :; done' &
      hog_pids+=($!)
    done
  fi
  SIMGPU_INSTANCE=$group DILU_COLO_GROUP=$group SIMGPU_TRACE=$trace \
    DILU_NODEMGR_SOCKET=$scratch/no-nodemgr.sock \
    "${prefix[@]}" "$bin/dilu" run --sim "${colo[@]}" -- \
    "$bin/cudarc-loop" --seconds "$seconds" --blocks 3960 --depth 32 >/dev/null 2>"$scratch/$group.err" ||
    { echo "loaded-host: the loop failed in row '${rows[$row]}':" >&2; cat "$scratch/$group.err" >&2; exit 1; }
  stop_hogs
  got[$row,$round]=$(python3 - "$trace" "$seconds" <<'EOF'
import json, sys
busy = 0
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    busy += r["end_ns"] - r["start_ns"]
print(f"{100 * busy / (float(sys.argv[2]) * 1e9):.1f}")
EOF
)
}

for round in $(seq "$rounds"); do
  for row in "${!rows[@]}"; do
    run "$row" "$round"
    echo "round $round: ${rows[$row]}: device ${got[$row,$round]}% busy" >&2
  done
done

{
  echo "# A filler on a host whose CPUs are busy"
  echo
  echo "Written by \`scripts/bench.sh loaded-host\` ($rounds rounds of ${seconds} s, $hogs CPU-bound processes beside the loop on $(nproc) cores; medians)."
  echo
  echo "cudarc-loop (300 µs kernels, a synchronisation every 32) on simgpu; the"
  echo "device's busy share over the loop's run, from simgpu's trace. dilu starts"
  echo "a \`--colo filler\` at nice 19 (its host threads are best effort); the row"
  echo "at nice 19 without co-location shows what that priority alone costs."
  echo
  echo "| row | device busy (median) | rounds |"
  echo "| --- | ---: | --- |"
  for row in "${!rows[@]}"; do
    values=()
    for round in $(seq "$rounds"); do values+=("${got[$row,$round]}"); done
    median=$(printf '%s\n' "${values[@]}" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    echo "| ${rows[$row]} | ${median}% | $(IFS=' '; echo "${values[*]}") |"
  done
} >"$out"
cat "$out"
