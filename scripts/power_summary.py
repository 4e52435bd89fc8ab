#!/usr/bin/env python3
"""Puts a summary at the top of power.md (written by `scripts/bench.sh
power`): per list and policy, under FGD's protocol, the share of the GPU
capacity allocated at 100% and 130% requested and the kW the cluster draws
at 50%, 70%, 90% and 100% requested, means over the seeds; the draw against
`fgd`'s (mean of its ratios at every checkpoint from 50% to 100%); and in
the replay in time, the mean kW against `fgd`'s. Then the same over all
lists. Reads the tables the simulator printed; edits nothing else.

usage: scripts/power_summary.py FILE
"""
import re
import sys

ALLOCATED_AT = (100, 130)
DRAWN_AT = (50, 70, 90, 100)
COMPARED = (50, 60, 70, 80, 90, 100)


def table_after(lines, start, header_prefix):
    """{row name: {column: cell}} of the first table whose header starts
    with `header_prefix` at or after line `start`, or None."""
    for at in range(start, len(lines)):
        if lines[at].startswith(header_prefix):
            columns = [cell.strip() for cell in lines[at].strip("|").split("|")]
            rows = {}
            for line in lines[at + 2:]:
                if not line.startswith("|"):
                    break
                cells = [cell.strip() for cell in line.strip("|").split("|")]
                rows[cells[0]] = dict(zip(columns[1:], cells[1:]))
            return rows
        if at > start and lines[at].startswith("FGD protocol"):
            return None
    return None


def percent_columns(row):
    return {int(name.rstrip("%")): float(cell.rstrip("%"))
            for name, cell in row.items() if re.fullmatch(r"\d+%", name)}


def section_figures(section):
    """Per policy: allocation and kW per checkpoint, one dict per seed, and
    the replay's mean kW."""
    lines = section.splitlines()
    seeds = {}
    replay = {}
    table = table_after(lines, 0, "| policy | mean kW drawn |")
    if table:
        replay = {name: float(row["mean kW drawn"]) for name, row in table.items()}
    for at, line in enumerate(lines):
        if not line.startswith("FGD protocol: "):
            continue
        allocated = table_after(lines, at, "| policy |")
        drawn = table_after(lines, at, "| policy (kW drawn) |")
        if not allocated or not drawn:
            continue
        for name in allocated:
            if name not in drawn:
                continue
            seeds.setdefault(name, []).append(
                (percent_columns(allocated[name]), percent_columns(drawn[name])))
    return seeds, replay


def mean(values):
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def summarise(text):
    sections = re.split(r"(?m)^## ", text)
    rows = []
    over_lists = {}
    for section in sections[1:]:
        name = section.splitlines()[0].strip()
        seeds, replay = section_figures(section)
        if "fgd" not in seeds:
            continue
        fgd = seeds["fgd"]
        for policy, runs in seeds.items():
            if len(runs) != len(fgd):
                continue
            allocated = [mean(run[0].get(at, float("nan")) for run in runs) for at in ALLOCATED_AT]
            drawn = [mean(run[1].get(at, float("nan")) for run in runs) for at in DRAWN_AT]
            ratios = [run[1][at] / base[1][at] - 1 for run, base in zip(runs, fgd)
                      for at in COMPARED if at in run[1] and at in base[1]]
            versus = 100 * mean(ratios)
            allocated_versus = allocated[0] - mean(base[0].get(100, float("nan")) for base in fgd)
            replayed = "n/a"
            if policy in replay and "fgd" in replay and replay["fgd"] > 0:
                replayed = f"{100 * (replay[policy] / replay['fgd'] - 1):+.1f}%"
            rows.append(f"| {name} | {policy} | {allocated[0]:.2f}% | {allocated[1]:.2f}% | "
                        + " | ".join(f"{value:.1f}" for value in drawn)
                        + f" | {versus:+.1f}% | {allocated_versus:+.2f} | {replayed} |")
            figures = over_lists.setdefault(policy, [])
            figures.append((versus, allocated_versus))
    if not rows:
        return None
    out = ["## Summary", "",
           "Under FGD's protocol, means over the seeds: the share of the GPU capacity allocated when",
           "100% and 130% of it has been requested, the kW the cluster draws at 50-100% requested, the",
           "draw against `fgd`'s in the same draw (mean of the ratios at 50, 60, ... 100%), allocation",
           "at 100% against `fgd`'s (points); in the replay in time, the mean draw against `fgd`'s.",
           "",
           "| list | policy | allocated 100% | allocated 130% | kW at 50% | kW at 70% | kW at 90% "
           "| kW at 100% | draw vs fgd | allocated vs fgd | replay draw vs fgd |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out += rows
    out += ["", f"Over the {len(over_lists.get('fgd', []))} lists:", "",
            "| policy | draw vs fgd: mean / least saving | allocated vs fgd at 100%: mean / worst |",
            "|---|---:|---:|"]
    for policy, figures in over_lists.items():
        draws = [figure[0] for figure in figures]
        allocations = [figure[1] for figure in figures]
        out.append(f"| {policy} | {mean(draws):+.1f}% / {max(draws):+.1f}% | "
                   f"{mean(allocations):+.2f} / {min(allocations):+.2f} |")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    text = open(path, encoding="utf-8").read()
    summary = summarise(text)
    if summary is None:
        sys.exit(f"{path}: no FGD-protocol tables with an fgd row")
    first = text.find("\n## ")
    text = text[:first + 1] + "\n" + summary + "\n" + text[first + 1:]
    open(path, "w", encoding="utf-8").write(text)


if __name__ == "__main__":
    main()
