"""Writes bench/results/frameworks.md from one run of scripts/frameworks.sh.

    python frameworks_report.py WORK COMMAND RATE SLO_MS SPLIT HAMI_NOTE COMMIT

WORK holds one folder per configuration with serve.out / train.out (the
programs' JSON lines) and simgpu's trace.jsonl. Device busy and shares are
device time from the trace over the server's window of requests, which the
trainer's timed steps cover (alone, the trainer's timed steps).
"""

import json
import os
import platform
import subprocess
import sys
import tempfile


def last_json(path):
    if not os.path.exists(path):
        return None
    found = None
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                pass
    return found


def tail(path, lines=3):
    if not os.path.exists(path):
        return ""
    text = [l.rstrip() for l in open(path, errors="replace") if l.strip()]
    return " / ".join(text[-lines:])


def union(intervals):
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def trace_busy(path, lo, hi):
    """Device busy over [lo, hi] and each process's share of it."""
    per_pid, everything = {}, []
    if not os.path.exists(path) or hi <= lo:
        return None, {}
    for line in open(path, errors="replace"):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "pid" not in row:
            continue
        a, b = max(row["start_ns"], lo), min(row["end_ns"], hi)
        if b > a:
            per_pid.setdefault(row["pid"], []).append((a, b))
            everything.append((a, b))
    span = hi - lo
    return union(everything) / span, {pid: union(iv) / span for pid, iv in per_pid.items()}


def trainer_kernels(path, pid, lo, hi):
    """The trainer's kernel lengths (ns) in its run alone over [lo, hi]: a
    kernel's segments summed (simgpu/README.md, whole kernels)."""
    kernels = {}
    for line in open(path, errors="replace"):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("pid") != pid or row["end_ns"] < lo or row["start_ns"] > hi:
            continue
        key = row.get("kernel", len(kernels))
        kernels[key] = kernels.get(key, 0) + row["end_ns"] - row["start_ns"]
    return list(kernels.values())


def as_if_alone_bound(work, serve_alone, train_alone):
    """The most of the server's idle time the trainer may keep with the
    server's p99 within 1.10x alone, arrivals unknown: `as-if-alone-bound`
    (bench/src/as_if_alone.rs) on both programs' runs alone. Returns
    (its JSON line, None) or (None, why)."""
    if not serve_alone or "requests_ns" not in serve_alone:
        return None, "the server's run alone lists no requests"
    if not train_alone or not train_alone.get("step_end_ns"):
        return None, "the trainer's run alone timed no steps"
    trace = os.path.join(work, "train-alone", "trace.jsonl")
    if not os.path.exists(trace):
        return None, "no trace of the trainer alone"
    lo = train_alone.get("start_ns", train_alone["step_end_ns"][0])
    lengths = trainer_kernels(trace, train_alone["pid"], lo, train_alone["step_end_ns"][-1])
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "as-if-alone-bound")
    with tempfile.TemporaryDirectory() as tmp:
        requests_file, kernels_file = os.path.join(tmp, "requests"), os.path.join(tmp, "kernels")
        with open(requests_file, "w") as f:
            f.writelines(f"{a} {l}\n" for a, l in serve_alone["requests_ns"])
        with open(kernels_file, "w") as f:
            f.writelines(f"{k}\n" for k in lengths)
        try:
            done = subprocess.run([binary, "--requests", requests_file, "--kernels", kernels_file],
                                  capture_output=True, text=True, timeout=120)
        except OSError as e:
            return None, f"as-if-alone-bound did not run: {e}"
    if done.returncode != 0:
        return None, done.stderr.strip()[:200]
    return json.loads(done.stdout), None


def main():
    work, command, rate, slo_ms, split, hami_note, commit = sys.argv[1:8]
    rows = []
    train_alone = last_json(os.path.join(work, "train-alone", "train.out"))
    alone_rate = train_alone["steps_per_second"] if train_alone else None
    # The server alone: the reference of the latency ratios, and the idle
    # time it leaves, which the trainer's device time is a harvest of.
    serve_alone = last_json(os.path.join(work, "serve-alone", "serve.out"))
    alone_busy = None
    if serve_alone:
        alone_busy, _ = trace_busy(os.path.join(work, "serve-alone", "trace.jsonl"), *serve_alone["window_ns"])
    bound, no_bound_why = as_if_alone_bound(work, serve_alone, train_alone)
    harvests = {}

    def row(label, folder, note=""):
        d = os.path.join(work, folder)
        if not os.path.isdir(d):
            return
        serve = last_json(os.path.join(d, "serve.out"))
        train = last_json(os.path.join(d, "train.out"))
        window = serve["window_ns"] if serve else None
        trained = None
        if train and train["step_end_ns"]:
            trained = [train.get("start_ns", train["step_end_ns"][0]), train["step_end_ns"][-1]]
        if window is None:
            window = trained
        elif trained:
            # Co-located: only the stretch both ran through. The trainer
            # outlives the server (frameworks.sh stops it after the server);
            # should it not have, the row says how much was left out.
            overlap = [max(window[0], trained[0]), min(window[1], trained[1])]
            if overlap != window:
                left_out = 1 - max(0, overlap[1] - overlap[0]) / (window[1] - window[0])
                note = (note + "; " if note else "") + f"trainer absent from {100 * left_out:.0f}% of the server's window, left out"
            window = overlap if overlap[1] > overlap[0] else None
        busy, shares = trace_busy(os.path.join(d, "trace.jsonl"), *window) if window else (None, {})
        cells = [label]
        if serve:
            cells += [f"{serve['requests']}", f"{serve['service_ms_mean']:.1f}", f"{serve['p50_ms']:.1f}", f"{serve['p99_ms']:.1f}"]
            if serve_alone and folder != "serve-alone" and serve_alone["p50_ms"] > 0 and serve_alone["p99_ms"] > 0:
                cells += [f"{serve['p50_ms'] / serve_alone['p50_ms']:.2f}× / {serve['p99_ms'] / serve_alone['p99_ms']:.2f}×"]
            else:
                cells += ["—"]
            cells += [f"{100 * serve['slo_violation_rate']:.1f}%"]
        elif os.path.exists(os.path.join(d, "serve.err")):
            cells += ["failed: " + tail(os.path.join(d, "serve.err"), 2)[:160], "", "", "", "", ""]
        else:
            cells += ["—", "", "", "", "", ""]
        steps_in_window = None
        if train and window:
            ends = [t for t in train["step_end_ns"] if window[0] <= t <= window[1]]
            steps_in_window = len(ends) / ((window[1] - window[0]) / 1e9)
        if train:
            ratio = f" ({100 * steps_in_window / alone_rate:.0f}% of alone)" if alone_rate and steps_in_window is not None else ""
            cells += [f"{steps_in_window:.2f}{ratio}" if steps_in_window is not None else "—"]
        elif os.path.exists(os.path.join(d, "train.err")):
            cells += ["failed: " + tail(os.path.join(d, "train.err"), 2)[:160]]
        else:
            cells += ["—"]
        cells += [f"{100 * busy:.1f}%" if busy is not None else "—"]
        ordered = sorted(shares.values(), reverse=True)
        cells += [" + ".join(f"{100 * s:.1f}%" for s in ordered) if ordered else "—"]
        # Harvest: the trainer's device time beside the server over the
        # time the server leaves idle alone.
        trainer_share = shares.get(train.get("pid")) if train and serve else None
        if trainer_share is not None and alone_busy is not None and alone_busy < 1:
            harvests[folder] = trainer_share / (1 - alone_busy)
            cells += [f"{100 * harvests[folder]:.1f}%"]
        elif folder == "serve-alone" and bound is not None:
            cells += [f"(as-if-alone bound {100 * bound['share_bound']:.1f}%)"]
        else:
            cells += ["—"]
        load = [open(os.path.join(d, f)).read().strip() if os.path.exists(os.path.join(d, f)) else "?"
                for f in ("load.before", "load.after")]
        cells += [f"{load[0]} → {load[1]}", note]
        rows.append("| " + " | ".join(cells) + " |")

    row("server alone", "serve-alone")
    row("trainer alone", "train-alone")
    row("no limiter", "no-limiter")
    row("static", "static", f"server SM request {split}%, trainer {100 - int(split)}%, limits 100%")
    row("dilu (defaults)", "dilu", "`--colo primary --slo-ms` / `--colo filler`, nothing else set")
    row("dilu without SLO", "dilu-noslo", "`--colo primary` / `--colo filler`: the server kept as if alone")
    profile = last_json(os.path.join(work, "profile", "profile.json"))
    if profile:
        row("dilu, profiled", "dilu-profiled",
            f"server `--colo primary --profile` (batch {profile['batch']}, SM request {profile['sm_request']}%, "
            f"limit {profile['sm_limit']}%), trainer `--colo filler`")
    elif os.path.isdir(os.path.join(work, "profile")):
        why = tail(os.path.join(work, "profile", "profile.err"), 1)[:160]
        rows.append(f"| dilu, profiled | — | | | | | | — | — | — | — | — | `dilu profile` failed: {why} |")
    if os.path.isdir(os.path.join(work, "hami-core")):
        row("HAMi-core", "hami-core", f"`CUDA_DEVICE_SM_LIMIT` {split} / {100 - int(split)}")
    else:
        rows.append(f"| HAMi-core | — | | | | | | — | — | — | — | — | {hami_note} |")

    serve_any = None
    for folder in ("serve-alone", "no-limiter", "dilu", "dilu-profiled"):
        serve_any = serve_any or last_json(os.path.join(work, folder, "serve.out"))
    train_any = train_alone or last_json(os.path.join(work, "dilu", "train.out"))
    model_line = []
    if serve_any:
        model_line.append(f"server: {serve_any['model']}, {serve_any['seq']} tokens per request, "
                          "up to `--batch` waiting requests per batch (1 unless a profile sets `DILU_BATCH`)")
    if train_any:
        model_line.append(f"trainer: {train_any['model']}, batch {train_any['batch']}, "
                          f"{train_any['image']}x{train_any['image']} images, SGD")
    try:
        import torch
        versions = f"torch {torch.__version__}"
        try:
            import torchvision
            versions += f", torchvision {torchvision.__version__}"
        except ImportError:
            pass
        try:
            import transformers
            versions += f", transformers {transformers.__version__}"
        except ImportError:
            pass
    except ImportError:
        versions = "torch not importable by the report"

    print("<!-- Written by scripts/frameworks.sh; do not edit by hand. -->")
    print("# Real models co-located on simgpu: a BERT-base server beside ResNet-50 training\n")
    print(f"Command: `{command}`.")
    print(f"Programs (`scripts/frameworks.py`, unmodified PyTorch, random weights, no download): "
          f"{'; '.join(model_line)}. {versions}.")
    print(f"Requests: Poisson at {rate}/s, answered in arrival order; SLO {slo_ms} ms per request "
          "(arrival to result on the host). Unless given, the rate is 30% of what the server answers "
          "back to back alone and the SLO 3x that service time, both measured at the start of the run.")
    print("Co-located runs: the trainer starts first, the server once the trainer's warm-up steps are done "
          "and its timed steps have begun, and the trainer trains on until the server has ended, so both "
          "run through the server's whole window of requests; training throughput is counted over that "
          "window. Device busy and shares: device time from simgpu's kernel trace over that window "
          "(the trainer alone: its timed steps). Service: the time from a request's start to its result, queueing left out. "
          "p50 / p99 vs alone: the server's percentiles over its own run alone (the field's yardstick). Harvest: the "
          "trainer's device time over the time the server leaves the device idle alone. "
          "HAMi-core: " + (hami_note or "not run") + ".\n")
    print("| configuration | requests | service ms (mean) | p50 ms | p99 ms | p50 / p99 vs alone | SLO violations | training steps/s | device busy | shares | harvest | host load | settings |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(r)
    print()
    if bound is not None:
        share = bound["share_bound"]
        noslo = harvests.get("dilu-noslo")
        against = (f" `dilu without SLO` harvested {100 * noslo:.1f}%, {100 * noslo / share:.0f}% of it."
                   if noslo is not None and share > 0 else "")
        print(f"As-if-alone bound (in `server alone`'s harvest cell): the most of the server's idle time the "
              f"trainer may keep with the server's p99 within 1.10x alone when nothing knows when requests "
              f"arrive, {100 * share:.1f}%, from both programs' runs alone (`as-if-alone-bound`, "
              "bench/src/as_if_alone.rs): a request arriving while the server is idle meets the trainer's work "
              "as often as the trainer keeps that time, then a kernel of each length as often as that length "
              "holds of the trainer's device time (a training step runs its kernels in its own order; no "
              "scheduler can run only its short ones), and waits the rest of it and a "
              f"{bound['handoff_ns'] / 1000:g} us hand-off; the "
              "requests so pushed over the bound may number what the p99's rank leaves (of "
              f"{bound['requests']} requests, those above the p99 less those already over the bound "
              f"alone: {bound['allowance']:g}), and the trainer keeping all of the idle time would push "
              f"{bound['pushes_per_share']:.2f} over in expectation.{against}\n")
    else:
        print(f"As-if-alone bound: not computed ({no_bound_why}).\n")
    print("simgpu computes no kernel results and charges each kernel ceil(blocks / 132) x 10 us of "
          "device time (simgpu/README.md), so a kernel's time follows its grid, not its arithmetic; "
          "the host side (Python, PyTorch's dispatcher, the driver calls) is real and runs on this "
          f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared with "
          "other builds. Both programs compete for those cores whatever the GPU-side limiter does. "
          "Host load: the 1-minute load average before and after each configuration "
          "(/proc/loadavg); rows run at different loads are not comparable on host-bound figures "
          "(service time, latency, steps/s).")
    if profile:
        print_profile(work, profile, slo_ms)


def print_profile(work, profile, slo_ms):
    """The `dilu profile` run the profiled row used: its trials and result."""
    trials = [l.strip() for l in open(os.path.join(work, "profile", "profile.err"), errors="replace")
              if "ms per batch" in l or "cannot run" in l]
    print()
    print("## `dilu profile` of the server\n")
    print(f"Before the `dilu, profiled` row: `dilu profile --sim --class latency --slo-ms {slo_ms} "
          "--max-batch B --trial-seconds S -- python scripts/frameworks.py measure` (B and S as the "
          "command gives, defaults 4 and 6), the server's request path in a closed loop at each "
          "batch and SM share, each batch's latency reported with `interposer/python/dilu_latency.py`; "
          "one program per batch size, its share changed between trials. Its result is what "
          "`dilu run --profile` gave the server in that row.\n")
    print(f"Chosen: batch {profile['batch']}, SM request {profile['sm_request']}% "
          f"({profile['throughput_at_request']:.1f} requests/s), SM limit {profile['sm_limit']}% "
          f"({profile['throughput_at_limit']:.1f} requests/s); {profile['trials']} configurations measured "
          "(SLO met with the profiler's default 10% to spare).\n")
    print("| trial | batch | SM % | latency per batch | requests/s |")
    print("|---:|---:|---:|---:|---:|")
    for i, line in enumerate(trials, 1):
        # "dilu profile: batch    1 at SM  10%: 2.646 ms per batch, 377.9 samples/s"
        head, _, what = line.partition("%: ")
        parts = head.split()
        batch, share = parts[3], parts[-1]
        if "ms per batch" in what:
            latency, throughput = what.split(", ")
            print(f"| {i} | {batch} | {share} | {latency.replace(' per batch', '')} | {throughput.split()[0]} |")
        else:
            print(f"| {i} | {batch} | {share} | {what} | — |")


if __name__ == "__main__":
    main()
