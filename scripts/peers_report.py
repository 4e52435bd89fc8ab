#!/usr/bin/env python3
"""Turns scripts/peers.sh's measurements into bench/results/peers.md.

usage: peers_report.py RESULTS.jsonl HAMI_COMMIT COMMAND   (markdown on stdout)

Each results line is one process run under one limiter: the suite's keys,
"limiter", "rc" (exit status), "out" (its JSON lines) and "err" (its last
stderr line). Sections appear for the suites present.
"""
import json
import sys

LIMITERS = ["dilu", "hami", "none"]
TITLE = {"dilu": "dilu", "hami": "HAMi-core", "none": "no limiter"}
MIB = 1 << 20
LIMIT = 1 << 30


def mib(v):
    return "n/a" if v is None else f"{v / MIB:.0f} MiB"


def failed(row):
    """A short description of a run that printed nothing, or None."""
    if row["out"]:
        return None
    what = f"exit {row['rc']}" if row["rc"] < 128 else f"killed by signal {row['rc'] - 128}"
    if row["rc"] in (134, 139):
        what += " (abort)" if row["rc"] == 134 else " (segfault)"
    return what + (f": `{row['err']}`" if row["err"] else "")


def device_use(trace_path, pid):
    """The fraction of its run (first kernel's start to last kernel's end) in
    which `pid` had a kernel running, from simgpu's trace; None without one."""
    try:
        spans = sorted((r["start_ns"], r["end_ns"]) for r in map(json.loads, open(trace_path))
                       if r["pid"] == pid)
    except OSError:
        return None
    if not spans:
        return None
    busy, (cur_start, cur_end) = 0, spans[0]
    for start, end in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return busy / max(1, spans[-1][1] - spans[0][0])


def device_split(trace_path, pids):
    """Each pid's share of device time (percent) while both were running.
    A pid's device time is the union of its kernels' spans: its kernels on
    several streams can run at once, and summing them would count that time
    once per stream (as `sm-accuracy.md` does not)."""
    recs = []
    with open(trace_path) as f:
        for line in f:
            r = json.loads(line)
            if r["pid"] in pids:
                recs.append(r)
    if any(not [r for r in recs if r["pid"] == p] for p in pids):
        return None
    first = {p: min(r["start_ns"] for r in recs if r["pid"] == p) for p in pids}
    last = {p: max(r["end_ns"] for r in recs if r["pid"] == p) for p in pids}
    lo, hi = max(first.values()), min(last.values())
    busy = {p: 0 for p in pids}
    reach = {p: lo for p in pids}
    for r in sorted(recs, key=lambda r: r["start_ns"]):
        p = r["pid"]
        start, end = max(r["start_ns"], reach[p]), min(r["end_ns"], hi)
        if end > start:
            busy[p] += end - start
        reach[p] = max(reach[p], min(r["end_ns"], hi))
    total = sum(busy.values()) or 1
    return [100.0 * busy[p] / total for p in pids]


class Report:
    def __init__(self, rows):
        self.rows = rows
        self.lines = []
        self.behind = []
        self.findings = []

    def p(self, text=""):
        self.lines.append(text)

    def suite(self, name):
        return [r for r in self.rows if r["suite"] == name]

    # ---- single process: memory view and per-call cost
    def probe(self):
        rows = self.suite("probe")
        if not rows:
            return
        probe = {(r["limiter"], r["sm"]): r for r in rows}
        p = self.p
        p("## Memory: one process, 1 GiB limit (`peer-probe`)")
        p()
        p("| | " + " | ".join(TITLE[l] for l in LIMITERS) + " |")
        p("|---|" + "---|" * len(LIMITERS))

        def line(label, f):
            cells = []
            for l in LIMITERS:
                r = probe.get((l, None))
                cells.append(failed(r) or f(r["out"][0]) if r else "n/a")
            p(f"| {label} | " + " | ".join(cells) + " |")

        line("`cuMemGetInfo` total", lambda r: mib(r["meminfo_total"]))
        line("`cuMemGetInfo` free at start", lambda r: mib(r["meminfo_free"]))
        line("`nvmlDeviceGetMemoryInfo` total", lambda r: mib(r["nvml_total"]))
        line("`nvmlDeviceGetMemoryInfo` used at start", lambda r: mib(r["nvml_used"]))
        line("allocated in 64 MiB pieces before the first refusal", lambda r: mib(r["allocated"]))
        line("refusal status", lambda r: str(r["refused_with"]))
        p()
        p("dilu charges every process a context allowance (256 MiB by default,")
        p("`DILU_CONTEXT_MEMORY`) against the budget when it starts, because real")
        p("contexts take memory; HAMi-core counts context memory as NVML reports it,")
        p("and simgpu charges none, so its whole 1 GiB is allocatable.")
        p()
        p("## Per-call cost (mean over 20000 calls, ns)")
        p()
        p("| call | dilu | HAMi-core | no limiter | HAMi-core / dilu |")
        p("|---|---|---|---|---|")
        for label, key, sm in [
            ("`cuLaunchKernel`, no SM limit", "launch_ns", None),
            ("`cuLaunchKernel`, SM limit 30%", "launch_ns", 30),
            ("`cuMemAlloc` + `cuMemFree` (1 MiB)", "alloc_free_ns", None),
            ("`cuMemGetInfo`", "meminfo_ns", None),
        ]:
            runs = {l: probe.get((l, sm if l != "none" else None)) for l in LIMITERS}
            if any(r is None or not r["out"] for r in runs.values()):
                p(f"| {label} | " + " | ".join(failed(runs[l]) or "n/a" for l in LIMITERS) + " | |")
                continue
            v = {l: runs[l]["out"][0][key] for l in LIMITERS}
            if v["hami"] < v["dilu"]:
                self.behind.append(f"{label}: {v['dilu']:.0f} ns vs HAMi-core's {v['hami']:.0f} ns")
            p(f"| {label} | {v['dilu']:.0f} | {v['hami']:.0f} | {v['none']:.0f} | {v['hami'] / v['dilu']:.2f} |")
        p()
        p("The SM-limited launch row is one process launching 10 µs kernels back to")
        p("back: its mean includes any time a limiter holds launches back to keep the")
        p("process at 30% of the device, so it measures enforcement as well as cost.")
        p()

    # ---- every allocation path
    def paths(self):
        rows = self.suite("paths")
        if not rows:
            return
        p = self.p
        by = {(r["path"], r["limiter"]): r for r in rows}
        order = list(dict.fromkeys(r["path"] for r in rows))
        p("## Memory: every allocation path, 1 GiB limit (`peer-suites paths`)")
        p()
        p("One process per path and limiter, on a fresh tenant: it allocates through")
        p("that path in 128 MiB pieces, up to 2 GiB, until the first refusal.")
        p("**granted** is what it got (more than 1024 MiB: the limit did not hold on")
        p("that path); then what `cuMemGetInfo` reported as free while it held all of")
        p("it, and whether freeing through the path gave everything back")
        p("(`cuMemGetInfo` free after = free before). The pre-3.2 `cuMemAlloc` (32-bit")
        p("pointers) is left out: simgpu answers it with NOT_SUPPORTED even unlimited.")
        p("dilu's 768 MiB is the 1 GiB less its context allowance (see above).")
        p()
        p("| path | dilu granted | HAMi-core granted | no limiter granted | dilu free while full | HAMi-core free while full | dilu / HAMi-core: all given back |")
        p("|---|---|---|---|---|---|---|")
        for path in order:
            cells, full, back = [], [], []
            for l in LIMITERS:
                r = by.get((path, l))
                why = failed(r) if r else "not run"
                if why:
                    cells.append(why)
                    if l != "none":
                        full.append("—")
                        back.append("—")
                    if l == "hami":
                        self.findings.append(f"`{path}`: HAMi-core's run failed ({why})")
                    continue
                o = r["out"][0]
                g = f"{o['granted'] // MIB} MiB"
                if o["refused_with"]:
                    g += f" (then {o['refused_with']})"
                if o["granted"] > LIMIT and l != "none":
                    g = f"**{g}**"
                    if l == "hami":
                        self.findings.append(
                            f"`{path}`: HAMi-core granted {o['granted'] // MIB} MiB under a 1024 MiB limit")
                    else:
                        self.findings.append(
                            f"`{path}`: dilu granted {o['granted'] // MIB} MiB under a 1024 MiB limit")
                if o["refused_with"] not in (0, 2) and l != "none":
                    self.findings.append(
                        f"`{path}`: {TITLE[l]} refused with {o['refused_with']}, not "
                        "CUDA_ERROR_OUT_OF_MEMORY (2)")
                cells.append(g)
                if l != "none":
                    full.append(mib(o["free_full"]))
                    back.append("yes" if o["free_after"] == o["free_before"] else
                                f"no: {mib(o['free_before'])} before, {mib(o['free_after'])} after")
            p(f"| `{path}` | " + " | ".join(cells) + " | " + " | ".join(full) + " | " + " / ".join(back) + " |")
        p()
        p("Where HAMi-core's source explains a row (`src/cuda/memory.c`, `src/allocator/allocator.c`")
        p("at the commit above): its `cuArrayCreate_v2`, `cuArray3DCreate_v2` and")
        p("`cuMemAllocFromPoolAsync` hooks forward to the driver with no check and no")
        p("count; `cuMipmappedArrayCreate` allocates first and then refuses only if the")
        p("tenant is already over its limit (its size is not computed, a TODO there), so")
        p("it never is; `cuMemAllocAsync` refuses through `add_chunk_async`, which returns")
        p("-1 (shown as 4294967295), not `CUDA_ERROR_OUT_OF_MEMORY`.")
        p()

    # ---- concurrent processes over one budget
    def concurrent(self):
        rows = self.suite("concurrent")
        if not rows:
            return
        p = self.p
        p("## Memory: 8 processes of one tenant racing for one 1 GiB budget (`peer-suites concurrent`)")
        p()
        p("Eight processes of one tenant start, initialise, then are released together;")
        p("each allocates 16 MiB pieces until refused and holds them. The sum is what")
        p("the tenant got; above 1024 MiB the budget was overcommitted. dilu runs")
        p("with `DILU_CONTEXT_MEMORY=0` here, so both count only the pieces.")
        p()
        p("| round | " + " | ".join(TITLE[l] for l in LIMITERS) + " |")
        p("|---|" + "---|" * len(LIMITERS))
        worst = {}
        for rnd in sorted({r["round"] for r in rows}):
            cells = []
            for l in LIMITERS:
                r = next((x for x in rows if x["round"] == rnd and x["limiter"] == l), None)
                why = failed(r) if r else "not run"
                if why:
                    cells.append(why)
                    continue
                o = r["out"][0]
                worst[l] = max(worst.get(l, 0), o["total"])
                cells.append(f"{o['total'] // MIB} MiB ({o['started']}/{o['procs']} started)")
            p(f"| {rnd} | " + " | ".join(cells) + " |")
        p()
        for l in ("dilu", "hami"):
            if worst.get(l, 0) > LIMIT:
                self.findings.append(
                    f"concurrent processes: {TITLE[l]}'s tenant got {worst[l] // MIB} MiB of a 1024 MiB budget")

    # ---- a SIGKILLed holder
    def sigkill(self):
        rows = self.suite("sigkill")
        if not rows:
            return
        p = self.p
        p("## Memory: a SIGKILLed holder (`peer-suites hold` / `grab`)")
        p()
        p("A process of the tenant holds 640 MiB of its 1 GiB budget; a second process")
        p("asks for 512 MiB (over the budget while the first lives); the first is")
        p("SIGKILLed; a third process asks for 512 MiB again, retrying for up to 10 s.")
        p()
        p("| | " + " | ".join(TITLE[l] for l in LIMITERS) + " |")
        p("|---|" + "---|" * len(LIMITERS))
        for when, label in [("held", "512 MiB while the holder lives"),
                            ("killed", "512 MiB after the holder was SIGKILLed")]:
            cells = []
            for l in LIMITERS:
                r = next((x for x in rows if x["when"] == when and x["limiter"] == l), None)
                why = failed(r) if r else "not run"
                if why:
                    cells.append(why)
                    continue
                o = r["out"][0]
                if when == "held":
                    cells.append("refused (status %d)" % o["first_status"] if o["granted_after_s"] is None
                                 else "granted")
                elif o["granted_after_s"] is None:
                    cells.append(f"**still refused after 10 s** (status {o['first_status']})")
                    if l != "none":
                        self.findings.append(
                            f"SIGKILLed holder: {TITLE[l]} did not give its 640 MiB back to the tenant within 10 s")
                elif o["first_status"]:
                    cells.append(f"granted after {o['granted_after_s']:.2f} s")
                else:
                    cells.append("granted at once")
            p(f"| {label} | " + " | ".join(cells) + " |")
        p()

    # ---- what each reports through cuMemGetInfo and NVML
    def view(self):
        rows = self.suite("view")
        if not rows:
            return
        p = self.p
        p("## What a process sees: `cuMemGetInfo` and NVML (`peer-suites view`)")
        p()
        p("Tenant A (1 GiB limit) has a sibling process holding 256 MiB; tenant B (another")
        p("container, 1 GiB limit) holds 512 MiB. The probe, in tenant A, holds 128 MiB")
        p("and reports. The truth on the device: 896 MiB in use by three processes,")
        p("384 MiB of them tenant A's. dilu's figures for tenant A include its")
        p("context allowance for both of the tenant's processes (2 × 256 MiB).")
        p()
        p("| | " + " | ".join(TITLE[l] for l in LIMITERS) + " |")
        p("|---|" + "---|" * len(LIMITERS))
        got = {}
        for l in LIMITERS:
            r = next((x for x in rows if x["limiter"] == l), None)
            got[l] = (r, failed(r) if r else "not run")

        def line(label, f):
            p(f"| {label} | " + " | ".join(why or f(r, r["out"][0]) for r, why in (got[l] for l in LIMITERS)) + " |")

        def procs(key):
            def show(r, o):
                v = o[key]
                if isinstance(v, dict):
                    return f"status {v['status']}"
                if v is None:
                    return "n/a"
                names = {o["pid"]: "self", r.get("sibling"): "sibling", r.get("other"): "other tenant"}
                items = [f"{names.get(pid, 'pid ' + str(pid))} {used // MIB} MiB" for pid, used in v]
                return f"{len(v)}: " + ", ".join(items) if items else "0"
            return show

        line("`cuMemGetInfo` free / total",
             lambda r, o: f"{mib(o['meminfo_free'])} / {mib(o['meminfo_total'])}")
        line("`nvmlDeviceGetMemoryInfo` used / total",
             lambda r, o: "n/a" if not o["nvml_memory"] or "status" in o["nvml_memory"] else
             f"{mib(o['nvml_memory']['used'])} / {mib(o['nvml_memory']['total'])}")
        line("`nvmlDeviceGetComputeRunningProcesses` (v1 struct)", procs("processes_v1"))
        line("`nvmlDeviceGetComputeRunningProcesses_v3`", procs("processes_v3"))
        p()

    # ---- start-up
    def startup(self):
        rows = self.suite("startup")
        if not rows:
            return
        p = self.p
        p("## Start-up with other processes of the tenant (`peer-suites startup`)")
        p()
        p("A process of the tenant is started again and again and timed from spawn to")
        p("its first `cuMemAlloc` returning (`cuInit`, primary context, 1 MiB), while K")
        p("other processes of the tenant hold memory. p50 / p90 in µs; added = p50")
        p("minus the no-limiter p50 of the same K.")
        p()
        p("| others | dilu p50 / p90 | HAMi-core p50 / p90 | no limiter p50 / p90 | dilu added | HAMi-core added |")
        p("|---|---|---|---|---|---|")
        for others in sorted({r["others"] for r in rows}):
            res = {}
            cells = []
            for l in LIMITERS:
                r = next((x for x in rows if x["others"] == others and x["limiter"] == l), None)
                why = failed(r) if r else "not run"
                if why:
                    cells.append(why)
                    continue
                o = r["out"][0]
                res[l] = o
                cells.append(f"{o['p50_us']:.0f} / {o['p90_us']:.0f}")
            added = []
            for l in ("dilu", "hami"):
                added.append(f"{res[l]['p50_us'] - res['none']['p50_us']:.0f}"
                             if l in res and "none" in res else "—")
            if "dilu" in res and "hami" in res and "none" in res:
                d = res["dilu"]["p50_us"] - res["none"]["p50_us"]
                h = res["hami"]["p50_us"] - res["none"]["p50_us"]
                if h < d:
                    self.behind.append(
                        f"start-up with {others} others: dilu adds {d:.0f} µs (p50) vs HAMi-core's {h:.0f} µs")
            p(f"| {others} | " + " | ".join(cells) + " | " + " | ".join(added) + " |")
        p()

    # ---- SM shares over the workload matrix
    def sm(self):
        splits = self.suite("split")
        if not splits:
            return
        p = self.p
        alone = {r["shape"]: r for r in self.suite("alone")}
        p("## SM shares: two tenants over the SM-time benchmark's workload shapes (`cudarc-loop`)")
        p()
        p("Two tenants run the same shape side by side with a target split. Device-time")
        p("split from simgpu's kernel trace while both ran; error = points off the")
        p("first tenant's target; throughput = kernels/s of each relative to the shape")
        p("alone with no limiter, summed (1.00: no device time lost). As in `sm-accuracy.md`, a split")
        p("is judged only where the shape alone uses at least the larger share of the device (else")
        p("demand, not the limiter, sets it): other cells are n/a and left out of the mean error.")
        p()
        p("| shape | target | dilu split | dilu error | dilu throughput | HAMi-core split | HAMi-core error | HAMi-core throughput |")
        p("|---|---|---|---|---|---|---|---|")
        shapes = list(dict.fromkeys(r["shape"] for r in splits))
        errors = {"dilu": [], "hami": []}
        demand_bound_cells = 0
        for shape in shapes:
            base = alone.get(shape)
            base_rate = base["out"][0]["kernels_per_second"] if base and base["out"] else None
            demand = None
            if base and base["out"] and base.get("trace"):
                demand = device_use(base["trace"], base["out"][0]["pid"])
            for want in ([30, 70], [10, 90], [50, 50]):
                cells = []
                demand_bound = demand is not None and demand * 100 < want[1]
                for l in (["dilu", "hami"] if want != [50, 50] else ["none"]):
                    sides = sorted((r for r in splits if r["shape"] == shape and r["limiter"] == l
                                    and r["want"] == want), key=lambda r: r["side"])
                    if len(sides) != 2:
                        cells += ["not run", "", ""]
                        continue
                    why = failed(sides[0]) or failed(sides[1])
                    if why:
                        cells += [why, "", ""]
                        if l == "hami":
                            self.findings.append(f"SM shares, {shape}: HAMi-core's run failed ({why})")
                        continue
                    a, b = sides[0]["out"][0], sides[1]["out"][0]
                    split = device_split(sides[0]["trace"], [a["pid"], b["pid"]])
                    if split is None:
                        cells += ["no overlap in the trace", "", ""]
                        continue
                    err = abs(split[0] - want[0])
                    if l != "none" and not demand_bound:
                        errors[l].append((shape, want, err))
                    elif l != "none":
                        demand_bound_cells += 1
                    tput = "n/a"
                    if base_rate:
                        t = [x["kernels_per_second"] / base_rate for x in (a, b)]
                        tput = f"{t[0]:.2f} + {t[1]:.2f} = {sum(t):.2f}"
                    shown = "—" if l == "none" else "n/a" if demand_bound else f"{err:.1f}"
                    cells += [f"{split[0]:.1f}/{split[1]:.1f}", shown, tput]
                if want == [50, 50]:
                    p(f"| {shape} | no limiter | {cells[0]} | | {cells[2]} | | | |")
                else:
                    p(f"| {shape} | {want[0]}/{want[1]} | " + " | ".join(cells) + " |")
        p()
        pairs = {(s, tuple(w)): e for s, w, e in errors["dilu"]}
        for s, w, e in errors["hami"]:
            d = pairs.get((s, tuple(w)))
            if d is not None and e < d:
                self.behind.append(f"SM split {w[0]}/{w[1]}, {s}: {d:.1f} points off vs HAMi-core's {e:.1f}")
        for l in ("dilu", "hami"):
            if errors[l]:
                mean = sum(e for _, _, e in errors[l]) / len(errors[l])
                worst = max(errors[l], key=lambda x: x[2])
                within = sum(1 for _, _, e in errors[l] if e <= 2.0)
                p(f"- {TITLE[l]}: mean error {mean:.1f} points over {len(errors[l])} cells, {within} within "
                  f"2 points; worst {worst[2]:.1f} ({worst[0]}, {worst[1][0]}/{worst[1][1]})")
        if demand_bound_cells:
            p(f"- {demand_bound_cells // 2} cells per limiter not judged (the shape alone uses less than the larger share)")
        p()


def main():
    path, commit, command = sys.argv[1:4]
    rows = []
    for number, line in enumerate(open(path), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"peers_report: {path} line {number} is not one JSON record ({e})")
    r = Report(rows)
    p = r.p
    p("# dilu and HAMi-core side by side on simgpu")
    p()
    p(f"Written by `{command}` (what `scripts/bench.sh peers` runs), with HAMI_CORE_SRC")
    p(f"at HAMi-core commit `{commit}`.")
    p("One run, one machine, one simulated GPU (simgpu with its simulated NVML);")
    p("dilu = `dilu run --sim --tenant T [--sm P] [--mem 1GiB]` (no node manager),")
    p("HAMi-core = its `libvgpu.so` built from that commit with gcc -O2 and")
    p("`LD_PRELOAD`ed as it documents (`CUDA_DEVICE_MEMORY_LIMIT`, `CUDA_DEVICE_SM_LIMIT`,")
    p("one `CUDA_DEVICE_MEMORY_SHARED_CACHE` per tenant). Costs are wall-clock")
    p("on a shared 2-core machine: compare columns, not absolute values.")
    p()
    for section in (r.probe, r.paths, r.concurrent, r.sigkill, r.view, r.startup, r.sm):
        section()
    p("## Findings: where a limiter did not hold")
    p()
    if not r.findings:
        p("None in this run.")
    for f in r.findings:
        p(f"- {f}")
    p()
    p("## Where dilu is behind in this run")
    p()
    if not r.behind:
        p("Nowhere in this run.")
    for b in r.behind:
        p(f"- {b}")
    p()
    print("\n".join(r.lines))


if __name__ == "__main__":
    main()
