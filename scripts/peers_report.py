#!/usr/bin/env python3
"""Turns scripts/peers.sh's measurements into bench/results/peers.md.

usage: peers_report.py RESULTS.jsonl HAMI_COMMIT COMMAND   (markdown on stdout)
"""
import json
import sys

LIMITERS = ["dilu", "hami", "none"]
TITLE = {"dilu": "dilu", "hami": "HAMi-core", "none": "no limiter"}
GIB = 1 << 30


def device_split(trace_path, pids):
    """Each pid's share of device time (percent) while both were running."""
    recs = []
    with open(trace_path) as f:
        for line in f:
            r = json.loads(line)
            if r["pid"] in pids:
                recs.append(r)
    first = {p: min(r["start_ns"] for r in recs if r["pid"] == p) for p in pids}
    last = {p: max(r["end_ns"] for r in recs if r["pid"] == p) for p in pids}
    lo, hi = max(first.values()), min(last.values())
    busy = {p: 0 for p in pids}
    for r in recs:
        busy[r["pid"]] += max(0, min(r["end_ns"], hi) - max(r["start_ns"], lo))
    total = sum(busy.values()) or 1
    return [100.0 * busy[p] / total for p in pids], (hi - lo) / 1e9


def main():
    path, commit, command = sys.argv[1:4]
    rows = [json.loads(l) for l in open(path)]
    probe = {(r["limiter"], r["sm"]): r["r"] for r in rows if r["suite"] == "probe"}
    alone = next(r["r"] for r in rows if r["suite"] == "alone")
    splits = [r for r in rows if r["suite"] == "split"]

    out = []
    p = out.append
    p("# dilu and HAMi-core side by side on simgpu")
    p("")
    p(f"Written by `{command}` (what `scripts/bench.sh peers` runs), with HAMI_CORE_SRC")
    p(f"at HAMi-core commit `{commit}`.")
    p("One run, one machine, one simulated GPU (simgpu with its simulated NVML);")
    p("dilu = `dilu run --sim --tenant T [--sm P] [--mem 1GiB]` (no node manager),")
    p("HAMi-core = its `libvgpu.so` built from that commit with gcc -O2 and")
    p("`LD_PRELOAD`ed as it documents (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_SM_LIMIT`,")
    p("one `CUDA_DEVICE_MEMORY_SHARED_CACHE` per tenant). Costs are wall-clock means")
    p("on a shared 2-core machine: compare columns, not absolute values.")
    p("")
    p("## Memory: one process, 1 GiB limit (`peer-probe`)")
    p("")
    p("| | " + " | ".join(TITLE[l] for l in LIMITERS) + " |")
    p("|---|" + "---|" * len(LIMITERS))

    def line(label, f):
        p(f"| {label} | " + " | ".join(f(probe[(l, None)]) for l in LIMITERS) + " |")

    mib = lambda v: "n/a" if v is None else f"{v / (1 << 20):.0f} MiB"
    line("`cuMemGetInfo` total", lambda r: mib(r["meminfo_total"]))
    line("`cuMemGetInfo` free at start", lambda r: mib(r["meminfo_free"]))
    line("`nvmlDeviceGetMemoryInfo` total", lambda r: mib(r["nvml_total"]))
    line("`nvmlDeviceGetMemoryInfo` used at start", lambda r: mib(r["nvml_used"]))
    line("allocated in 64 MiB pieces before the first refusal", lambda r: mib(r["allocated"]))
    line("refusal status", lambda r: str(r["refused_with"]))
    p("")
    p("dilu charges every process a context allowance (256 MiB by default,")
    p("`DILU_CONTEXT_MEMORY`) against the budget when it starts, because real")
    p("contexts take memory; HAMi-core counts context memory as NVML reports it,")
    p("and simgpu charges none, so its whole 1 GiB is allocatable.")
    p("")
    behind_calls, behind_shares = [], []
    p("## Per-call cost (mean over 20000 calls, ns)")
    p("")
    p("| call | dilu | HAMi-core | no limiter | HAMi-core / dilu |")
    p("|---|---|---|---|---|")
    for label, key, sm in [
        ("`cuLaunchKernel`, no SM limit", "launch_ns", None),
        ("`cuLaunchKernel`, SM limit 30%", "launch_ns", 30),
        ("`cuMemAlloc` + `cuMemFree` (1 MiB)", "alloc_free_ns", None),
        ("`cuMemGetInfo`", "meminfo_ns", None),
    ]:
        v = {l: probe[(l, sm if l != "none" else None)][key] for l in LIMITERS}
        if v["hami"] < v["dilu"]:
            behind_calls.append(f"{label}: {v['dilu']:.0f} ns vs HAMi-core's {v['hami']:.0f} ns")
        p(f"| {label} | {v['dilu']:.0f} | {v['hami']:.0f} | {v['none']:.0f} | {v['hami'] / v['dilu']:.2f} |")
    p("")
    p("The SM-limited launch row is one process launching 10 µs kernels back to")
    p("back: its mean includes any time a limiter holds launches back to keep the")
    p("process at 30% of the device, so it measures enforcement as well as cost.")
    p("")
    p("## SM shares: two processes, 100 µs kernels (`cudarc-loop --depth 1000`)")
    p("")
    p("Device-time split from simgpu's kernel trace while both ran; throughput is")
    p(f"kernels/s relative to one process alone ({alone['kernels_per_second']:.0f}/s);")
    p("work ratio = kernels completed by the first process / the second.")
    p("")
    errors = {}
    p("| target | limiter | device-time split | error (points) | throughput vs alone | work ratio (target) |")
    p("|---|---|---|---|---|---|")
    for s in splits:
        a, b = s["a"], s["b"]
        split, _ = device_split(s["trace"], [a["pid"], b["pid"]])
        want = s["want"]
        err = abs(split[0] - want[0]) if s["limiter"] != "none" else float("nan")
        tput = [x["kernels_per_second"] / alone["kernels_per_second"] for x in (a, b)]
        ratio = a["kernels"] / max(1, b["kernels"])
        target = f"{want[0] / want[1]:.2f}" if s["limiter"] != "none" else "1.00"
        err_s = "—" if s["limiter"] == "none" else f"{err:.1f}"
        errors[(tuple(want), s["limiter"])] = (err, sum(tput))
        p(f"| {want[0]}/{want[1]} | {TITLE[s['limiter']]} | {split[0]:.1f}/{split[1]:.1f} | {err_s} "
          f"| {tput[0]:.2f} + {tput[1]:.2f} = {sum(tput):.2f} | {ratio:.2f} ({target}) |")
    for want in sorted({k[0] for k in errors}):
        d, h = errors.get((want, "dilu")), errors.get((want, "hami"))
        if d and h and h[0] < d[0]:
            behind_shares.append(
                f"SM split {want[0]}/{want[1]}: {d[0]:.1f} points off vs HAMi-core's {h[0]:.1f}")
        if d and h and h[1] > d[1]:
            behind_shares.append(
                f"SM split {want[0]}/{want[1]}: total throughput {d[1]:.2f} of alone vs HAMi-core's {h[1]:.2f}")
    p("")
    p("## Where dilu is behind in this run")
    p("")
    behind = [b for b in behind_calls + behind_shares]
    if not behind:
        p("Nowhere in this run.")
    for b in behind:
        p(f"- {b}")
    p("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
