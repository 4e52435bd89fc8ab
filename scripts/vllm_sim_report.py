"""Writes bench/results/vllm-sim.md from the outputs scripts/vllm-sim-check.sh
leaves in WORK_DIR (per step: NAME.out, NAME.err, NAME.trace.jsonl, NAME.rc
when it failed).

    python vllm_sim_report.py WORK_DIR PAIR_WAVE > bench/results/vllm-sim.md
"""

import json
import os
import re
import sys

GIB = 1 << 30
work, pair_wave = sys.argv[1], sys.argv[2]


def text(name):
    path = os.path.join(work, name)
    return open(path, errors="replace").read() if os.path.exists(path) else ""


def steps(name):
    """The JSON lines vllm_sim_check.py printed, by step name."""
    out = {}
    for line in (text(f"{name}.out") + text(f"{name}.err")).splitlines():
        if line.startswith('{"step"'):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            out[record["step"]] = record
    return out


def log_value(name, pattern):
    m = re.search(pattern, text(f"{name}.out") + text(f"{name}.err"))
    return m.groups() if m else None


def trace(name, window=None):
    """Per process: kernels, those replayed from graphs, device time (ms) of
    each; only the part of each kernel inside `window` (start_ns, end_ns)
    when given."""
    per_pid = {}
    for line in text(f"{name}.trace.jsonl").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        start, end = r["start_ns"], r["end_ns"]
        if window:
            start, end = max(start, window[0]), min(end, window[1])
            if end <= start:
                continue
        p = per_pid.setdefault(r["pid"], {"kernels": 0, "graph": 0, "ms": 0.0, "graph_ms": 0.0})
        ms = (end - start) / 1e6
        if r.get("last", True):
            p["kernels"] += 1
            p["graph"] += bool(r.get("graph"))
        p["ms"] += ms
        if r.get("graph"):
            p["graph_ms"] += ms
    return per_pid


def engine_trace(name, window=None):
    """The process that ran the kernels (vLLM's engine core)."""
    per_pid = trace(name, window)
    if not per_pid:
        return None
    return max(per_pid.values(), key=lambda p: p["kernels"])


def check(ok, what):
    return ("pass" if ok else "FAIL"), what


def run_rows(name, budget, utilisation, graphs):
    s = steps(name)
    rows = []
    nvml = s.get("NVML in the parent", {})
    rows.append(check(nvml.get("nvml_total") == budget,
                      f"NVML in the parent, before the engine starts: total {nvml.get('nvml_total')} B "
                      f"(budget {budget} B){'' if nvml.get('ok') else ': ' + nvml.get('detail', 'no answer')}"))
    start = s.get("engine start", {})
    rows.append(check(start.get("ok"), f"engine start (forked engine process): "
                      f"{start.get('detail', 'no line')}, {start.get('seconds', '?')} s"))
    seen = log_value(name, r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup")
    rows.append(check(seen is not None and abs(float(seen[1]) - budget / GIB) < 0.01,
                      f"vLLM's memory profile: free/total on the device "
                      f"{'/'.join(seen) + ' GiB' if seen else 'not logged'}"))
    kv = s.get("KV cache", {})
    kv_bytes = kv.get("kv_bytes") or 0
    limit = int(budget * utilisation)
    rows.append(check(0 < kv_bytes <= limit,
                      f"KV cache {kv_bytes} B ({kv_bytes / GIB:.3f} GiB; {kv.get('detail', '')}) "
                      f"within utilisation x budget = {limit} B"))
    gen = s.get("generate", {})
    rows.append(check(gen.get("ok"), f"generate: {gen.get('detail', 'no line')}, "
                      f"{gen.get('seconds', '?')} s"))
    engine = engine_trace(name)
    if graphs:
        captured = len(re.findall(r"Capturing CUDA graphs \(([^)]*)\): 100%",
                                  text(f"{name}.out") + text(f"{name}.err")))
        rows.append(check(engine is not None and engine["graph"] > 0 and captured > 0,
                          f"graphs: {captured} capture phases finished; kernels replayed from graphs "
                          f"in simgpu's trace {engine['graph'] if engine else 0} of "
                          f"{engine['kernels'] if engine else 0}"))
    else:
        rows.append(check(engine is not None and engine["kernels"] > 0 and engine["graph"] == 0,
                          f"eager: {engine['kernels'] if engine else 0} kernels in simgpu's trace, "
                          f"none from graphs"))
    rc = text(f"{name}.rc").strip()
    rows.append(check(not rc, f"exit status {rc or 0}"))
    return rows


def table(rows):
    print("| result | check |")
    print("|---|---|")
    for result, what in rows:
        print(f"| {result} | {what.replace('|', '/')} |")
    print()


versions = steps("eager").get("versions", {}).get("detail", "unknown")
print("<!-- Written by scripts/vllm-sim-check.sh (summary: scripts/vllm_sim_report.py); do not edit by hand. -->")
print("# vLLM on simgpu under `dilu run --sim`")
print()
print(f"Versions: {versions}; simgpu's simulated H100 (cc 9.0, 80 GiB) and NVML.")
print("Model: a 2-layer Llama-style config made on the spot (hidden 256, 4 heads of 64, "
      "vocab 1024), `load_format=\"dummy\"`, no tokenizer; offline generation from token ids. "
      "simgpu computes no kernel results, so the tokens are not meaningful; what is checked is "
      "what a user of dilu would notice. Set for every step, unrelated to dilu: "
      "`VLLM_USE_FLASHINFER_SAMPLER=0`, `VLLM_USE_V2_MODEL_RUNNER=0`. vLLM forks its engine "
      "process (its default), after asking NVML in the parent.")
print()
all_rows = []
for title, name, graphs in [("Eager, `--mem 4GiB`, gpu_memory_utilization 0.5", "eager", False),
                            ("CUDA graphs (piecewise and full), `--mem 4GiB`, gpu_memory_utilization 0.5",
                             "graphs", True)]:
    print(f"## {title}")
    print()
    rows = run_rows(name, 4 * GIB, 0.5, graphs)
    all_rows += rows
    table(rows)

print("## A utilisation the budget cannot hold: `--mem 4GiB`, gpu_memory_utilization 0.95")
print()
start = steps("refused").get("engine start", {})
reason = log_value("refused", r"(Free memory on device \S* ?\([\d./]+ GiB\) on startup is less than[^\n]*)")
rows = [check(start.get("ok") is False and reason is not None,
              f"engine start refused: {reason[0][:300] if reason else start.get('detail', 'no line')[:300]}")]
all_rows += rows
table(rows)

print("## Two vLLM processes at once on one GPU: `--mem 2GiB --sm 30` and `--mem 2GiB --sm 70`, CUDA graphs")
print()
print(f"Each kernel lasts at least {pair_wave} here (`SIMGPU_WAVE_NS`; simgpu's default is 10 us), "
      "so that during generation the device, not Python, is the bottleneck; both processes "
      "start generating together (a barrier after their engines are up).")
print()
for name in ["sm30", "sm70"]:
    print(f"### `{name}`")
    print()
    rows = run_rows(name, 2 * GIB, 0.5, True)
    all_rows += rows
    table(rows)
windows = [steps(name).get("generate", {}) for name in ["sm30", "sm70"]]
if all("start_ns" in w for w in windows):
    window = (max(w["start_ns"] for w in windows), min(w["end_ns"] for w in windows))
    span_ms = (window[1] - window[0]) / 1e6
    pair = {name: engine_trace(name, window) for name in ["sm30", "sm70"]}
    if span_ms > 0 and all(pair.values()):
        print(f"Device time in simgpu's trace while both generated ({span_ms / 1000:.2f} s, from the "
              "later start of generation to the earlier end):")
        print()
        print("| process | kernels | from graphs | device ms | of which graphs | share of the window |")
        print("|---|---|---|---|---|---|")
        for name, p in pair.items():
            print(f"| {name} | {p['kernels']} | {p['graph']} | {p['ms']:.1f} | {p['graph_ms']:.1f} | "
                  f"{100 * p['ms'] / span_ms:.1f}% |")
        print()
        ratio = pair["sm30"]["ms"] / pair["sm70"]["ms"] if pair["sm70"]["ms"] else float("nan")
        print(f"sm30 / sm70 device time while both generated: {ratio:.2f} (the shares' ratio is 30/70 = 0.43).")
        print()
    else:
        print("The two generations did not overlap; no split to report.")
        print()
failed = [what for result, what in all_rows if result != "pass"]
print(f"**{len(all_rows) - len(failed)} of {len(all_rows)} checks pass.**")
