"""How NVML reports one process's GPU use over time (nvmlDeviceGetProcessUtilization).

dilu's usage feedback (interposer/src/usage_feedback.rs) and simgpu's
simulated NVML both rest on what these samples mean: how often they come,
and what smUtil says for a process whose kernels keep the GPU busy a known
fraction of the time. This polls NVML every --poll-ms while the process runs
and prints one JSON line: the samples of that pid (time since the first, in
ms, and smUtil), the median spacing, and the busy time they add up to,
counted the way usage_feedback.rs counts it (each sample covers the time
since the previous one of the same pid).

    python3 scripts/nvml_process_samples.py --seconds 3 -- PROGRAM ARGS...
"""
import argparse
import json
import subprocess
import sys
import time

import pynvml


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--poll-ms", type=float, default=50.0)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a program to run is required after --")

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.index)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    started = time.time()
    last_seen = 0
    samples = {}
    while child.poll() is None and time.time() - started < args.seconds + 30:
        try:
            for s in pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen):
                last_seen = max(last_seen, s.timeStamp)
                if s.pid == child.pid:
                    samples[s.timeStamp] = s.smUtil
        except pynvml.NVMLError_NotFound:
            pass
        time.sleep(args.poll_ms / 1000.0)
    output = child.communicate()[0]
    pynvml.nvmlShutdown()

    stamps = sorted(samples)
    spacing = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    busy_us = sum((b - a) * samples[b] / 100.0 for a, b in zip(stamps, stamps[1:]))
    covered_us = stamps[-1] - stamps[0] if len(stamps) > 1 else 0
    program = next((json.loads(l) for l in output.splitlines() if l.startswith("{")), None)
    print(json.dumps({
        "samples": len(stamps),
        "spacing_ms_median": spacing[len(spacing) // 2] / 1000.0 if spacing else None,
        "spacing_ms_max": spacing[-1] / 1000.0 if spacing else None,
        "sm_util": [samples[t] for t in stamps],
        "busy_fraction_counted": busy_us / covered_us if covered_us else None,
        "program": program,
    }))


if __name__ == "__main__":
    sys.exit(main())
