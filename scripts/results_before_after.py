"""Puts a results file beside an earlier version of itself.

For each file, every markdown table row of the current version is matched
with the row of the same table (by position among the file's tables) that
has the same leading cells (the first, or as many as tell the rows apart)
in the earlier version, and every cell that changed
is written "before → after". Rows only in one version are listed as such.
Prints markdown to stdout.

    python3 scripts/results_before_after.py REV FILE... > OUT.md
    python3 scripts/results_before_after.py --before-dir TREE [--label L] [--run CMD] FILE... > OUT.md

With --before-dir, each file's earlier version is TREE/FILE (another
checkout whose benchmarks ran: scripts/bench-before-after.sh) instead of
the version committed at REV; --run names the command that ran both sides
(bench-before-after.sh passes its own invocation), so that the report says
how to run it again.
"""
import os
import shlex
import subprocess
import sys


def tables(text):
    """The file's markdown tables: a list of (header, rows), each row a list
    of cells."""
    found, current = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if current is None:
            current = (cells, [])
            found.append(current)
        elif set("".join(cells)) <= set("-: "):
            continue
        else:
            current[1].append(cells)
    return found


def keyed(rows, width):
    """Rows by their first `width` cells, in order."""
    return [(" | ".join(row[:width]), row) for row in rows]


def key_width(*row_lists):
    """The fewest leading cells that tell every row of each list apart (a
    table whose first column repeats, e.g. one row per setting of several
    columns, is matched on more of them)."""
    widest = max((len(r) for rows in row_lists for r in rows), default=1)
    for width in range(1, widest + 1):
        if all(len({tuple(r[:width]) for r in rows}) == len(rows) for rows in row_lists):
            return width
    return widest


def earlier(path, rev, before_dir):
    """The earlier version of `path`, or None."""
    if before_dir is not None:
        full = os.path.join(before_dir, path)
        return open(full).read() if os.path.exists(full) else None
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def compare(path, rev, before_dir=None):
    before_text = earlier(path, rev, before_dir)
    if before_text is None:
        return f"## {path}\n\nnot in {before_dir or rev}: nothing to compare.\n"
    after, before = tables(open(path).read()), tables(before_text)
    out = [f"## {path}\n"]
    for index, (header, rows) in enumerate(after):
        if index >= len(before):
            out.append(f"Table {index + 1}: new.\n")
            continue
        old_rows = before[index][1]
        width = key_width(rows, old_rows)
        old_by_key = dict(keyed(old_rows, width))
        out.append(f"Table {index + 1}: " + " | ".join(header[:4]) + (" …" if len(header) > 4 else "") + "\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        new_keys = set()
        for key, new in keyed(rows, width):
            new_keys.add(key)
            old = old_by_key.get(key)
            if old is None:
                out.append("| " + " | ".join([new[0] + " (new row)"] + new[1:]) + " |")
                continue
            cells = []
            for i, value in enumerate(new):
                was = old[i] if i < len(old) else ""
                cells.append(value if was == value else f"{was} → {value}")
            out.append("| " + " | ".join(cells) + " |")
        gone = [k for k, _ in keyed(old_rows, width) if k not in new_keys]
        if gone:
            out.append("\nRows only before: " + "; ".join(gone))
        out.append("")
    return "\n".join(out) + "\n"


def main():
    args = sys.argv[1:]
    before_dir, label, run = None, None, None
    while args and args[0] in ("--before-dir", "--label", "--run"):
        if len(args) < 2:
            sys.exit(__doc__)
        if args[0] == "--before-dir":
            before_dir = args[1]
        elif args[0] == "--label":
            label = args[1]
        else:
            run = args[1]
        args = args[2:]
    if before_dir is None:
        if len(args) < 2:
            sys.exit(__doc__)
        rev, paths = args[0], args[1:]
    else:
        rev, paths = label or before_dir, args
    if not paths:
        sys.exit(__doc__)
    print("# Results before and after\n")
    if before_dir is None:
        commit = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True).stdout.strip()
        print(f"Command: `python3 scripts/results_before_after.py {rev} {' '.join(paths)}`.")
        print(f"Before: the files at {rev} ({commit}); after: the files as committed with this one.")
    else:
        command = ["python3", "scripts/results_before_after.py", "--before-dir", before_dir, "--label", rev, *paths]
        print(f"Command: `{shlex.join(command)}`.")
        print(f"Before: the files the benchmarks wrote in a checkout of {rev} ({before_dir}), in the same run")
        print("(`scripts/bench-before-after.sh`) as after: the files they wrote in this tree.")
        if run:
            print(f"Both sides were run by `{run}`.")
    print("Each changed cell reads before → after.\n")
    for path in paths:
        print(compare(path, rev, before_dir))


if __name__ == "__main__":
    main()
