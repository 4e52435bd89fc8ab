#!/usr/bin/env bash
# Two tenants under `dilu run --sim --sm A` and `--sm B` on one simulated GPU,
# both running cudarc-loop with the same arguments; prints each tenant's share
# of wall-clock time and of the device time the two used, from simgpu's trace
# (union of each process's rows over the window in which both ran).
#
#   scripts/sm-pair.sh A B [cudarc-loop args...]
#   scripts/sm-pair.sh 30 70 --seconds 4 --depth 1000 --streams 3
#   SIMGPU_SHARING=serial scripts/sm-pair.sh 30 70 --seconds 4   (the older model)
#
# Uses the debug build (cargo build --workspace first).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: scripts/sm-pair.sh A B [cudarc-loop args...]" >&2; exit 2; }
a=$1 b=$2; shift 2
bin=target/debug
dir=$(mktemp -d /tmp/sm-pair.XXXXXX)
trap 'rm -rf "$dir"' EXIT
instance=sm-pair-$$
n=0
for share in "$a" "$b"; do
  n=$((n + 1))
  SIMGPU_INSTANCE=$instance SIMGPU_TRACE=$dir/trace.jsonl \
    "$bin/dilu" run --sim --tenant "$instance-$n" --sm "$share" -- \
    "$bin/cudarc-loop" "$@" --json >"$dir/out-$n.json" 2>"$dir/err-$n.log" &
  echo $! >"$dir/pid-$n"
done
wait
python3 - "$dir/trace.jsonl" "$a" "$(cat "$dir/pid-1")" "$b" "$(cat "$dir/pid-2")" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first, last, spans = {}, {}, collections.defaultdict(list)
for r in rows:
    p = r["pid"]
    first[p] = min(first.get(p, 1 << 63), r["start_ns"])
    last[p] = max(last.get(p, 0), r["end_ns"])
lo, hi = max(first.values()), min(last.values())
for r in rows:
    s, e = max(r["start_ns"], lo), min(r["end_ns"], hi)
    if e > s:
        spans[r["pid"]].append((s, e))
busy = {}
for p, l in spans.items():
    l.sort(); total, reached = 0, 0
    for s, e in l:
        s = max(s, reached)
        if e > s:
            total += e - s; reached = e
    busy[p] = total
used = sum(busy.values()); span = hi - lo
# `dilu run` execs the program: the pid started is the tenant's.
for cap, p in ((sys.argv[2], int(sys.argv[3])), (sys.argv[4], int(sys.argv[5]))):
    print(f"cap {cap}%: {100 * busy.get(p, 0) / span:.1f}% of wall-clock time, "
          f"{100 * busy.get(p, 0) / used:.1f}% of the device time used")
print(f"device busy {100 * used / span:.1f}% over {span / 1e9:.2f} s")
PY
