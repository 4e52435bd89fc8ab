#!/usr/bin/env python3
"""Puts a summary at the top of openb-lists.md (written by
`scripts/bench.sh openb-lists`): for every list, `dilu` and `fgd` under FGD's
protocol at 100% and 130% of the GPU capacity requested, means over the
seeds, and `dilu` − `fgd` paired by seed with two standard errors: ahead or
behind only where the difference passes them, else a tie. Reads the tables
the simulator printed; edits nothing else.

usage: scripts/openb_lists_summary.py FILE
"""
import math
import re
import sys

AT = (100, 130)


def protocol_tables(section):
    """One {policy: {requested %: allocated %}} per FGD-protocol table."""
    tables = []
    for block in re.split(r"(?m)^FGD protocol: ", section)[1:]:
        lines = block.splitlines()
        header = next((line for line in lines if line.startswith("| policy |")), None)
        if header is None:
            continue
        columns = [cell.strip() for cell in header.strip("|").split("|")]
        rows = {}
        for line in lines[lines.index(header) + 2:]:
            if not line.startswith("|"):
                break
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            values = {}
            for name, cell in zip(columns[1:], cells[1:]):
                match = re.fullmatch(r"(\d+)%", name)
                if match and cell.endswith("%"):
                    values[int(match.group(1))] = float(cell.rstrip("%"))
            rows[cells[0]] = values
        tables.append(rows)
    return tables


def paired(tables, at):
    """Means of dilu and fgd, and the mean and two standard errors of
    dilu − fgd, over the seeds that measured both at `at`."""
    pairs = [(t["dilu"][at], t["fgd"][at]) for t in tables
             if at in t.get("dilu", {}) and at in t.get("fgd", {})]
    if not pairs:
        return None
    diffs = [d - f for d, f in pairs]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1)) if n > 1 else 0.0
    return (sum(d for d, _ in pairs) / n, sum(f for _, f in pairs) / n, mean, 2 * sd / math.sqrt(n), n)


def verdict(mean, two_se):
    if mean - two_se > 0:
        return "ahead"
    if mean + two_se < 0:
        return "behind"
    return "tie"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    text = open(path, encoding="utf-8").read()
    parts = re.split(r"(?m)^## ", text)
    head, sections = parts[0], parts[1:]
    lines = [
        "## Summary: `dilu` against `fgd` under FGD's protocol",
        "",
        "Share of the GPU capacity allocated when 100% and 130% of it has been requested, means over",
        "the seeds; `dilu` − `fgd` paired by seed (the same draw), ± two standard errors: ahead or",
        "behind only beyond them, else a tie.",
        "",
        "| list | seeds | dilu 100% | fgd 100% | dilu − fgd at 100% | dilu 130% | fgd 130% | dilu − fgd at 130% |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    counts = {"ahead": 0, "tie": 0, "behind": 0}
    behind = []
    for section in sections:
        name = section.splitlines()[0].strip()
        tables = protocol_tables(section)
        results = [paired(tables, at) for at in AT]
        if any(result is None for result in results):
            lines.append(f"| {name} | 0 | — | — | not measured | — | — | not measured |")
            behind.append(name)
            continue
        cells = []
        worst = "ahead"
        for dilu, fgd, mean, two_se, _ in results:
            said = verdict(mean, two_se)
            worst = {"ahead": said, "tie": "behind" if said == "behind" else "tie",
                     "behind": "behind"}[worst]
            cells.append(f"{dilu:.2f}% | {fgd:.2f}% | {mean:+.2f} ± {two_se:.2f} ({said})")
        counts[worst] += 1
        if worst == "behind":
            behind.append(name)
        lines.append(f"| {name} | {results[0][4]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Of {len(sections)} lists, at both points `dilu` is ahead on {counts['ahead']}, ties on "
        f"{counts['tie']} and is behind on {counts['behind']}"
        + (f" ({', '.join(behind)})." if behind else "."),
        "",
        "",
    ]
    open(path, "w", encoding="utf-8").write(head + "\n".join(lines) + "".join("## " + s for s in sections))


if __name__ == "__main__":
    main()
