#!/usr/bin/env python3
"""How old each results file is against the code it measures: for every
bench/results/*.md, the date of the commit that last wrote it, how many
commits have changed product code since (abi, layout, colocation,
interposer, nodemgr, simgpu, placement, cluster-lite), and the command its
first lines name to write it again. Oldest first; GPU-only files (written by
scripts/gpu-*.sh) are marked, since they need a GPU host to rerun.

    python3 scripts/results_age.py [--older-than N]   # only files N or more commits behind
"""

import argparse
import glob
import os
import re
import subprocess
import sys

PRODUCT = ["abi", "layout", "colocation", "interposer", "nodemgr", "simgpu", "placement", "cluster-lite"]


def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--older-than", type=int, default=0, help="list only files at least this many commits behind")
    args = parser.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    rows = []
    for path in sorted(glob.glob("bench/results/*.md")):
        last = git("log", "-1", "--format=%h %cs", "--", path)
        if not last:
            continue  # not committed yet
        commit, date = last.split()
        behind = int(git("rev-list", "--count", f"{commit}..HEAD", "--", *PRODUCT) or 0)
        head = "".join(open(path, encoding="utf-8").readlines()[:8])
        found = re.search(r"`((?:[A-Z_]+=(?:<[^>`]*>|\S+) )*(?:scripts/|python3 scripts/|cargo )[^`]*)`", head) or re.search(
            r"Written by (scripts/\S+)", head
        )
        name = os.path.basename(path)
        if found:
            command = found.group(1)
        elif name.startswith("gpu-check-"):
            command = "scripts/gpu-check.sh"
        else:
            command = "(no command named in its first lines)"
        # `--sim` runs a GPU check's workload on simgpu: no GPU needed.
        gpu = "scripts/gpu-" in command and "--sim" not in command
        rows.append((behind, path, date, command, gpu))
    rows = [r for r in rows if r[0] >= args.older_than]
    rows.sort(key=lambda r: -r[0])
    print("| results file | written | product commits since | command | needs a GPU |")
    print("| --- | --- | ---: | --- | --- |")
    for behind, path, date, command, gpu in rows:
        print(f"| {os.path.basename(path)} | {date} | {behind} | `{command}` | {'yes' if gpu else ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
