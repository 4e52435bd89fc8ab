#!/usr/bin/env bash
# Instructions per cuLaunchKernel through the interposer, counted with
# valgrind's callgrind: repeatable on a loaded machine, where timings move by
# tens of ns from run to run. A C launch loop (bench/callgrind/launch_loop.c)
# dlopens simgpu's null driver and the interposer as the overhead bench does
# and launches the no-op kernel 20,000 times after 20,000 unmeasured ones:
# directly, through the interposer without a share (memory budget only), and
# with an SM-time share of 99% (bucket 1 s deep): with defaults, with fair turns
# off, with leases off (every launch visits the bucket). simgpu's per-call host
# costs are off (a spin would count as instructions) and the monotonic clock
# is virtual (bench/callgrind/virtual_clock.c: 4 µs more at every read), so
# that the estimates the interposer measures, and so how many launches a
# lease covers, are the same in every run, loaded machine or not, and about
# what they are natively with simgpu's 3.8 µs launches.
# With DILU_PEER_HAMI naming a libvgpu.so built from HAMi-core's sources (as
# scripts/peers.sh builds it), HAMi-core's launches are counted on the same
# loop, LD_PRELOADed as HAMi-core documents it, with a memory limit and
# with an SM limit of 99% too; without it, those rows say "not run".
#                                   -> bench/results/launch-instructions.md
#
# usage: scripts/launch-instructions.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "launch-instructions: needs valgrind" >&2; exit 2; }
if [ "${1:-}" != "--no-build" ]; then
  cargo build --release -p simgpu -p simgpu-nvml -p dilu-interposer
fi
out=target/launch-instructions
mkdir -p "$out"
cc -O2 -g -o "$out/launch_loop" bench/callgrind/launch_loop.c -ldl
cc -O2 -shared -fPIC -o "$out/virtual_clock.so" bench/callgrind/virtual_clock.c -ldl
simgpu=$PWD/target/release/libsimgpu.so
interposer=$PWD/target/release/libdilu_interposer.so
N=20000
tenant="launch-ir-$$"

# run LABEL SIDE [VAR=VALUE...]
run() {
  local label=$1 side=$2
  shift 2
  env SIMGPU_NULL=1 SIMGPU_CALL_COST=0 SIMGPU_INSTANCE="$tenant-$label" \
    DILU_REAL_LIBCUDA="$simgpu" DILU_MEM_LIMIT=64GiB DILU_CONTEXT_MEMORY=0 \
    SIMGPU_LIB="$simgpu" DILU_LIB="$interposer" "$@" \
    CLOCK_STEP_NS=4000 LD_PRELOAD="$PWD/$out/virtual_clock.so" \
    valgrind --tool=callgrind --toggle-collect=measured \
    --callgrind-out-file="$out/$label.callgrind" "$out/launch_loop" "$side" $N $N \
    2>"$out/$label.log" || { cat "$out/$label.log" >&2; exit 1; }
  rm -f "/dev/shm/dilu-$(id -u)/$tenant-$label".* 2>/dev/null || true
}

# run_hami LABEL [VAR=VALUE...]: the loop through HAMi-core's libvgpu.so,
# preloaded (it finds the driver by name: simgpu as libcuda.so.1).
run_hami() {
  local label=$1 libdir="$PWD/$out/hami-lib"
  shift
  mkdir -p "$libdir"
  ln -sf "$simgpu" "$libdir/libcuda.so.1"
  ln -sf "$simgpu" "$libdir/libcuda.so"
  ln -sf "$PWD/target/release/libsimgpu_nvml.so" "$libdir/libnvidia-ml.so.1"
  rm -f "$out/$label.cache"
  env SIMGPU_NULL=1 SIMGPU_CALL_COST=0 SIMGPU_INSTANCE="$tenant-$label" \
    LD_LIBRARY_PATH="$libdir" CUDA_DEVICE_MEMORY_LIMIT=65536m \
    CUDA_DEVICE_MEMORY_SHARED_CACHE="$out/$label.cache" LIBCUDA_LOG_LEVEL=0 "$@" \
    SIMGPU_LIB="$simgpu" DILU_LIB="$DILU_PEER_HAMI" \
    CLOCK_STEP_NS=4000 LD_PRELOAD="$PWD/$out/virtual_clock.so:$DILU_PEER_HAMI" \
    valgrind --tool=callgrind --toggle-collect=measured \
    --callgrind-out-file="$out/$label.callgrind" "$out/launch_loop" dilu $N $N \
    2>"$out/$label.log" || { cat "$out/$label.log" >&2; exit 1; }
  rm -f "$out/$label.cache"
}

share=(DILU_SM_LIMIT=99)
run direct direct
run pass-through dilu
run share dilu "${share[@]}" DILU_TENANT="$tenant-share" DILU_SM_ABLATE=depth=1s
run share-turns-off dilu "${share[@]}" DILU_TENANT="$tenant-turns" DILU_SM_ABLATE=depth=1s,turns
run share-leases-off dilu "${share[@]}" DILU_TENANT="$tenant-leases" DILU_SM_ABLATE=depth=1s,leases
rm -f "$out"/hami-*.callgrind
if [ -n "${DILU_PEER_HAMI:-}" ]; then
  [ -f "$DILU_PEER_HAMI" ] || { echo "launch-instructions: DILU_PEER_HAMI=$DILU_PEER_HAMI is not a file" >&2; exit 2; }
  run_hami hami-memory
  run_hami hami-share CUDA_DEVICE_SM_LIMIT=99
else
  echo "launch-instructions: DILU_PEER_HAMI not set: HAMi-core's rows are not run" >&2
fi

machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores online, $(valgrind --version)"
python3 - "$out" "$N" "$machine" <<'PY'
import collections, os, re, subprocess, sys
out, n, machine = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# The loop's calls of cuLaunchKernel, counted apart from every other call.
LOOP_LAUNCHES = "(launches from the loop)"

def counts(label):
    """Total Ir, calls per function name, and exclusive Ir per source file of
    the interposer's and layout's code (inlined code counts in its own file);
    None when the row was not run."""
    path = f"{out}/{label}.callgrind"
    if not os.path.exists(path):
        return None
    names, calls, fn, cfn = {}, collections.Counter(), None, None
    total = None
    for line in open(path):
        m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
        if m:
            if m.group(3):
                names[m.group(2)] = m.group(3)
            if m.group(1) == "fn":
                fn, cfn = names[m.group(2)], None
            else:
                cfn = names[m.group(2)]
        elif line.startswith("calls=") and cfn:
            count = int(line.split("=")[1].split()[0])
            calls[cfn] += count
            if fn == "launches" and cfn == "cuLaunchKernel":
                calls[LOOP_LAUNCHES] += count
        elif line.startswith("summary:"):
            total = int(line.split()[1])
    annotate = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", path],
                              capture_output=True, text=True, check=True).stdout
    by_file = collections.Counter()
    for line in annotate.splitlines():
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(\S+?):", line)
        if m and re.search(r"(^|/)(interposer|layout)/src/", m.group(2)):
            by_file[re.sub(r"^(.*/)?((interposer|layout)/src/)", r"\2", m.group(2))] += int(m.group(1).replace(",", ""))
        elif m and "tls_get_addr" in m.group(2):
            by_file["(__tls_get_addr: thread-locals of a dlopened library)"] += int(m.group(1).replace(",", ""))
    return total, calls, by_file

def called(calls, suffix):
    return sum(c for name, c in calls.items() if name.endswith(suffix))

def per_launch(calls, suffix):
    """Calls of `suffix` per launch (callgrind's call counts come out
    doubled; the loop's calls of cuLaunchKernel count launches in the same
    unit)."""
    launches = calls[LOOP_LAUNCHES]
    return called(calls, suffix) / launches if launches else 0.0

rows = [
    ("direct", "simgpu directly"),
    ("pass-through", "through dilu, no share (memory budget only)"),
    ("share", "through dilu, SM share 99% (defaults)"),
    ("share-turns-off", "SM share, fair turns off (`DILU_SM_ABLATE=turns`)"),
    ("share-leases-off", "SM share, leases off (`DILU_SM_ABLATE=leases`): every launch visits the bucket"),
    ("hami-memory", "HAMi-core, memory limit (`CUDA_DEVICE_MEMORY_LIMIT`)"),
    ("hami-share", "HAMi-core, memory limit and SM limit 99% (`CUDA_DEVICE_SM_LIMIT=99`)"),
]
data = {label: counts(label) for label, _ in rows}
direct = data["direct"][0] / n
lines = [
    "# Instructions per launch (callgrind)",
    "",
    "Command: `"
    + ("DILU_PEER_HAMI=<HAMi-core's libvgpu.so> " if data["hami-memory"] is not None else "")
    + "scripts/launch-instructions.sh` (valgrind's callgrind on `bench/callgrind/launch_loop.c`,",
    "release builds). Instruction counts, unlike timings on a shared machine, repeat from run to run",
    "(within a few instructions: which launches are sampled).",
    "",
    f"Machine: {machine}.",
    "",
    f"Each row: {n:,} `cuLaunchKernel` calls of the no-op 1×1 kernel on the null stream, after {n:,}",
    "uncounted ones (the kind's first samples), on simgpu's null driver (`SIMGPU_NULL=1`) with its",
    "per-call host costs off (`SIMGPU_CALL_COST=0`: their spin would count as instructions). The",
    "process's monotonic clock is virtual (`bench/callgrind/virtual_clock.c`): it advances 4 µs at",
    "every read, whatever time passes, so durations the interposer measures (its kernel estimates,",
    "hence how many launches a 64 µs lease covers) are the same in every run, loaded machine or not,",
    "and about what they are natively with simgpu's 3.8 µs launches (`overhead-sm-launch.md`): one",
    "launch in sixteen visits the bucket. A share has a bucket 1 s deep (`DILU_SM_ABLATE=depth=1s`): no launch",
    "waits.",
    "",
    "| launches | instructions per launch | added to direct | bucket visits per 1,000 launches | timed launches (samples) |",
    "| --- | ---: | ---: | ---: | ---: |",
]
for label, text in rows:
    if data[label] is None:
        lines.append(f"| {text} | not run (`DILU_PEER_HAMI` not set) | | | |")
        continue
    total, calls, _ = data[label]
    per = total / n
    added = "—" if label == "direct" else f"+{per - direct:.0f}"
    visits = per_launch(calls, "launch_control::admit_through_bucket") * 1000
    timed = round(per_launch(calls, "launch_control::timed") * n)
    plain = label in ("direct", "pass-through") or label.startswith("hami")
    visits_text = "—" if plain else f"{visits:.0f}"
    timed_text = "—" if plain else f"{timed}"
    lines.append(f"| {text} | {per:.0f} | {added} | {visits_text} | {timed_text} |")
lines += [
    "",
    "A process with no SM-time state (no tenant, SM limit or co-location role) has its launch rows",
    "pass straight to the driver (`interposer/src/entry/pass_through.rs`): the no-share row. HAMi-core",
    "(`DILU_PEER_HAMI`, built from its sources) calls its rate limiter only in a process whose host",
    "pid it found in NVML's process list (`pidfound`); simgpu's null driver publishes no process, so",
    "its SM-limit row runs the same code as its memory row and is a floor for a limited launch.",
    "",
    "Timed launches: a kind is timed one sample at a time, the next due launch only after the",
    "sampler's thread has read the last sample's events (it polls every 1 to 20 ms). Under valgrind,",
    "which runs one thread at a time, that thread seldom runs while the loop launches, so few or none",
    "of the measured launches are timed: the rows count the untimed launch, which is all but one",
    "launch in hundreds natively (a 4 µs kind is timed at most one launch in 256, and one per poll).",
]
lines += [
    "",
    "Where the instructions of the interposer's own code go, by source file (exclusive: code",
    "inlined from a file counts in that file), per launch:",
    "",
    "| source file | no share | SM share | SM share, leases off |",
    "| --- | ---: | ---: | ---: |",
]
files = collections.Counter()
for label in ("pass-through", "share", "share-leases-off"):
    files.update(data[label][2])
for path, _ in sorted(files.items(), key=lambda kv: -data["share-leases-off"][2][kv[0]]):
    cells = [data[label][2][path] / n for label in ("pass-through", "share", "share-leases-off")]
    if max(cells) < 0.5:
        continue
    lines.append(f"| `{path}` | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
lines += [
    "",
    "The rest of each row is simgpu's launch itself (the direct row), the C loop and standard-library",
    "code inlined into the interposer (atomics, `Option`, thread-local and `OnceLock` plumbing).",
    "Instructions are not time: a bucket visit's atomic read-modify-writes on shared lines and its",
    "clock read cost more than their count says; `overhead-sm-launch.md` has the ns.",
    "",
]
open("bench/results/launch-instructions.md", "w").write("\n".join(lines))
print("\n".join(lines))
PY
echo "results written to bench/results/launch-instructions.md" >&2
