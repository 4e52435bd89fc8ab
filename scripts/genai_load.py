#!/usr/bin/env python3
"""Writes bench/data/alibaba-genai/generative-qps-by-minute.txt from qps.csv
of Alibaba's GenAI serving trace (alibaba/clusterdata,
cluster-trace-v2026-GenAI/qps.tar.gz): the service's generative requests per
second, one line per minute from its first sample, in the format of
`bench/data/dilu-workloads/` (one relative rate >= 0 per line).

Each container reports its QPS about every 57 s, so a minute may hold two of
its samples or none: a container's samples within a minute are averaged (two
samples are not twice the load), and the containers' averages summed.

usage: scripts/genai_load.py QPS_CSV [OUT]
"""

import csv
import sys
from collections import defaultdict


COLUMNS = ("timestamp_anon", "value", "container_ip", "request_type")


def by_minute(path):
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                sys.exit(f"{path}: not the trace's qps.csv (no column {', '.join(missing)})")
            rows = [r for r in reader if r["request_type"] == "Generative Requests"]
    except OSError as error:
        sys.exit(f"cannot read {path}: {error}")
    if not rows:
        sys.exit(f"{path}: no 'Generative Requests' rows")
    try:
        times = [float(r["timestamp_anon"]) for r in rows]
        values = [float(r["value"]) for r in rows]
    except ValueError as error:
        sys.exit(f"{path}: a timestamp or value is not a number ({error})")
    start = min(times)
    samples = defaultdict(list)
    for r, time, value in zip(rows, times, values):
        samples[(r["container_ip"], int((time - start) // 60))].append(value)
    total = defaultdict(float)
    for (_, minute), values in samples.items():
        total[minute] += sum(values) / len(values)
    return [total.get(minute, 0.0) for minute in range(max(total) + 1)]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[-1])
    rates = by_minute(sys.argv[1])
    text = "".join(f"{rate:.4f}\n" for rate in rates)
    if len(sys.argv) == 3:
        with open(sys.argv[2], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(
        f"{len(rates)} minutes, mean {sum(rates) / len(rates):.3f}, peak {max(rates):.3f}, "
        f"{sum(1 for r in rates if r == 0)} at 0",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
