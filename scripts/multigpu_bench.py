#!/usr/bin/env python3
"""An 8-GPU node (simgpu, SIMGPU_DEVICES=8) under `dilu nodemgr` with 24
tenants of mixed classes, placed by the node manager (`dilu run`): per-GPU
busy time, SLO violations of the latency tenants, training throughput and
the control loop's work per period. Run by `scripts/bench.sh multigpu`,
once per controller (the default `dilu`, and `static` for comparison).

usage: multigpu_bench.py BIN_DIR OUT.md [--seconds S] [--controllers a,b]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

GPUS = 8


def tenants():
    """(name, class flags, program args): 8 servers, 12 trainers, 4
    best-effort deep queues. Limits are such that the placement policy's
    bound on a GPU's summed limits (1.35) admits three tenants a GPU."""
    out = []
    for i in range(8):
        out.append((f"serve{i}", ["--class", "latency", "--slo-ms", "50",
                                  "--sm-request", "30", "--sm-limit", "50"],
                    ["demo-tenant", "serve", "--slo-ms", "50", "--rate", "40"]))
    for i in range(12):
        out.append((f"train{i}", ["--class", "batch", "--sm-request", "20",
                                  "--sm-limit", "35"],
                    ["demo-tenant", "train", "--load-ms", "4"]))
    for i in range(4):
        out.append((f"fill{i}", ["--class", "batch", "--sm-request", "0",
                                 "--sm-limit", "20"],
                    ["cudarc-loop", "--blocks", "13200", "--depth", "never", "--json"]))
    return out


def status(dilu, socket):
    try:
        out = subprocess.run([dilu, "status", "--json", "--socket", socket],
                             capture_output=True, timeout=10)
        return json.loads(out.stdout) if out.returncode == 0 else None
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        return None


def run(bin_dir, controller, seconds):
    bin_dir = os.path.abspath(bin_dir)
    dilu = os.path.join(bin_dir, "dilu")
    work = tempfile.mkdtemp(prefix="dilu-multigpu-")
    nvml = os.path.join(work, "nvml")
    os.makedirs(nvml)
    os.symlink(os.path.join(bin_dir, "libsimgpu_nvml.so"),
               os.path.join(nvml, "libnvidia-ml.so.1"))
    socket = os.path.join(work, "nodemgr.sock")
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update({"SIMGPU_INSTANCE": f"multigpu-{os.getpid()}-{controller}",
                "SIMGPU_DEVICES": str(GPUS), "DILU_NODEMGR_SOCKET": socket})
    config = os.path.join(work, "nodemgr.toml")
    with open(config, "w") as f:
        f.write(f'controller = "{controller}"\n')
    daemon = subprocess.Popen(
        [dilu, "nodemgr", "--config", config, "--socket", socket,
         "--run-dir", os.path.join(work, "run"), "--foreground", "--metrics", ""],
        env={**env, "LD_LIBRARY_PATH": nvml},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while True:
        s = status(dilu, socket)
        if s and len(s["gpus"]) == GPUS:
            break
        if time.time() > deadline:
            daemon.kill()
            sys.exit("multigpu: the node manager did not list 8 GPUs")
        time.sleep(0.2)
    procs = {}
    first = time.time()
    for name, flags, program in tenants():
        cmd = [dilu, "run", "--sim", "--tenant", name, *flags, "--",
               os.path.join(bin_dir, program[0]), *program[1:], "--seconds", str(seconds)]
        procs[name] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
        print(f"multigpu ({controller}): started {name}", file=sys.stderr)
    # Per-GPU busy: NVML utilisation and the tenants' own device time,
    # sampled once a second while every tenant runs.
    samples = {g: [] for g in range(GPUS)}
    placed = {}
    started = time.time()
    while any(p.poll() is None for p in procs.values()):
        # While every tenant runs: after start-up, before the first ends.
        now = time.time()
        s = status(dilu, socket) if started + 3 < now < first + seconds - 1 else None
        if s:
            for t in s["tenants"]:
                if t["gpu"] is not None:
                    placed[t["name"]] = t["gpu"]
            for g in s["gpus"]:
                used = sum(t["sm_achieved_pct"] for t in s["tenants"] if t["gpu"] == g["index"])
                samples[g["index"]].append((g["utilization"], used))
        time.sleep(1.0)
    final = status(dilu, socket)
    daemon.kill()
    daemon.wait()
    shutil.rmtree(work, ignore_errors=True)
    results = {}
    for name, p in procs.items():
        out, err = p.communicate()
        line = (out.strip().splitlines() or [""])[-1]
        try:
            results[name] = json.loads(line)
        except json.JSONDecodeError:
            results[name] = {"error": (err.strip().splitlines() or ["no output"])[-1]}
    return samples, placed, results, final


def mean(values):
    return sum(values) / len(values) if values else float("nan")


def report(controller, samples, placed, results, final):
    lines = [f"## controller `{controller}`", ""]
    periods = final["control_periods"] if final else 0
    if periods:
        lines.append(
            f"Control loop: {periods} periods, mean CPU time "
            f"{final['control_work_seconds_total'] * 1e6 / periods:.1f} µs per period, "
            f"longest {final['control_work_max_ms']:.2f} ms.")
        lines.append("")
    lines += ["| GPU | tenants | requests | NVML busy (mean) | tenants' device time (mean, summed) | SLO violations (served requests) |",
              "|---:|---|---:|---:|---:|---:|"]
    specs = {name: flags for name, flags, _ in tenants()}
    for g in range(GPUS):
        names = sorted(n for n, gpu in placed.items() if gpu == g)
        reserved = sum(float(specs[n][specs[n].index("--sm-request") + 1]) for n in names)
        util = [u for u, _ in samples[g] if u is not None]
        used = [x for _, x in samples[g]]
        served = [results[n] for n in names if results.get(n, {}).get("mode") == "serve"]
        violations = sum(r["violations"] for r in served)
        requests = sum(r["requests"] for r in served)
        slo = f"{100 * violations / requests:.1f}% ({requests})" if requests else "-"
        lines.append(f"| gpu{g} | {', '.join(names) or '-'} | {reserved:.0f}% | "
                     f"{100 * mean(util):.0f}% | {mean(used):.0f}% | {slo} |")
    lines.append("")
    served = [r for r in results.values() if r.get("mode") == "serve"]
    all_violations = sum(r["violations"] for r in served)
    all_requests = sum(r["requests"] for r in served)
    trains = [r["iterations_per_second"] for n, r in results.items() if r.get("mode") == "train"]
    fills = [r["kernels_per_second"] for n, r in results.items() if "kernels_per_second" in r]
    failed = [f"{n}: {r['error']}" for n, r in results.items() if "error" in r]
    lines.append(f"All latency tenants: {100 * all_violations / max(all_requests, 1):.1f}% of "
                 f"{all_requests} requests over the 50 ms SLO. Training: "
                 f"{mean(trains):.1f} iterations/s per tenant (mean of {len(trains)}). "
                 f"Best-effort deep queues: {mean(fills):.0f} kernels/s per tenant "
                 f"(mean of {len(fills)}).")
    if failed:
        lines.append("")
        lines.append("Tenants without a result: " + "; ".join(failed))
    lines.append("")
    return lines


def main():
    args = sys.argv[1:]
    if len(args) < 2 or args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if args and args[0] in ("-h", "--help") else 2)
    bin_dir, out_path = args[0], args[1]
    seconds, controllers = 30, ["dilu", "static"]
    rest = args[2:]
    while rest:
        flag = rest.pop(0)
        if flag == "--seconds" and rest:
            seconds = float(rest.pop(0))
        elif flag == "--controllers" and rest:
            controllers = rest.pop(0).split(",")
        else:
            sys.exit(f"multigpu: unknown argument {flag!r} (try --help)")
    extra = " ".join(sys.argv[3:])
    lines = ["# An 8-GPU node with 24 tenants", "",
             f"Command: `scripts/bench.sh multigpu{' -- ' + extra if extra else ''}` "
             f"(runs `scripts/multigpu_bench.py`, release build). simgpu with 8 GPUs; the node "
             "manager places each tenant with `dilu run` (placement policy `dilu`). Tenants: 8 "
             "inference servers (`demo-tenant serve`, 40 req/s in bursts, request 30%, limit 50%, "
             "SLO 50 ms), 12 training loops (`demo-tenant train`, 4 ms data loads, request 20%, "
             "limit 35%) and 4 best-effort deep queues (`cudarc-loop`, 1 ms kernels, request 0%, "
             f"limit 20%), each running {seconds:g} s. Busy time is sampled once a second from "
             "`dilu status` while all run. Machine: "
             f"{os.cpu_count()} cores, load average {' '.join(open('/proc/loadavg').read().split()[:3])} at the start.",
             ""]
    for controller in controllers:
        lines += report(controller, *run(bin_dir, controller, seconds))
    with open(out_path, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
