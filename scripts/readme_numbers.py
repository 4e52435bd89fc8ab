#!/usr/bin/env python3
"""Checks that README.md's results table quotes its results files.

Every number in the third column ("result there") of the table under the
header `| what | file | result there |` must appear verbatim in one of the
files that row links to (second column, and links inside the third column).
The first column says what was measured and is not checked.

A number is a run of digits, with an optional decimal part, optional
thousands commas ("1,000") and an optional sign just before it (+41.5), and
a `%` or `×` written right after it (91.6%, 1.70×). A number inside a word
(p99, x86) or inside a code span (`--sm 30`: flags, not results) is not one.
A number matches where a file has the same text not inside a longer number:
"0.11%" matches "0.11%" but not "10.11%" or "0.115%"; an unsigned number may
be signed in the file ("1.05" matches "+1.05"), a signed one must be signed
alike. A unit is the reader's and not checked: `%` or `×` right after the
number may be absent in the file (a column header such as "busy %" or
"dilu / HGSS" gives it), and a unit after a space (ns, µs, points) is not
read at all. The check is per row and per number: a number found in the
row's files, but in another cell than the one the README means, passes.

Usage: readme_numbers.py [README]   one line per problem; exit 1 if any
       readme_numbers.py --self-test  alters one number in each row of a
                                      copy of README.md and expects each
                                      to be reported
"""

import os
import re
import sys
import tempfile

HEADER = "| what | file | result there |"
NUMBER = re.compile(r"(?<![\w.,])[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?[%×]?")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
CODE = re.compile(r"`[^`]*`")


def cells(line):
    """The cells of a table row; `|` inside a code span does not split."""
    out, cur, code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def rows(text):
    """(line number, cells) for each row of the results table, or None."""
    lines = text.split("\n")
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == HEADER)
    except StopIteration:
        return None
    out = []
    for i in range(start + 2, len(lines)):
        if not lines[i].lstrip().startswith("|"):
            break
        out.append((i + 1, cells(lines[i])))
    return out


def numbers(cell):
    """The numbers a results cell quotes, in order."""
    prose = LINK.sub(lambda m: m.group(1), CODE.sub(" ", cell))
    return NUMBER.findall(prose)


def targets(row):
    """Files a row links to, in its second and third columns."""
    return [m.group(2).split("#")[0] for c in row[1:3] for m in LINK.finditer(c)]


def occurs(number, text):
    """`number` is in `text`, not as part of a longer number."""
    bare = number.rstrip("%×")
    return re.search(r"(?<![\d.,])" + re.escape(bare) + r"(?!\d|[.,]\d)", text) is not None


def check(readme, base=None):
    """Problems, one string each, for README file `readme`; its links are
    relative to `base` (by default the README's own folder)."""
    base = base or os.path.dirname(os.path.abspath(readme))
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    table = rows(text)
    if table is None:
        return [f"{readme}: no results table (header `{HEADER}`)"]
    if not table:
        return [f"{readme}: the results table has no rows"]
    problems = []
    for line, row in table:
        if len(row) != 3:
            problems.append(f"{readme}:{line}: results row has {len(row)} cells, not 3")
            continue
        files = targets(row)
        if not files:
            problems.append(f"{readme}:{line}: results row links to no file")
            continue
        texts = []
        for target in files:
            path = os.path.join(base, target)
            try:
                with open(path, encoding="utf-8") as f:
                    texts.append(f.read())
            except (OSError, UnicodeDecodeError) as e:
                problems.append(f"{readme}:{line}: cannot read {target}: {e}")
        for number in numbers(row[2]):
            if not any(occurs(number, t) for t in texts):
                problems.append(
                    f"{readme}:{line}: {number} is in none of {', '.join(files)}"
                )
    return problems


def altered(number):
    """`number` with its last digit changed: 91.6% -> 91.7%."""
    i = max(i for i, c in enumerate(number) if c.isdigit())
    return number[:i] + str((int(number[i]) + 1) % 10) + number[i + 1 :]


def self_test(readme):
    base = os.path.dirname(os.path.abspath(readme))
    with open(readme, encoding="utf-8") as f:
        lines = f.read().split("\n")
    table = rows("\n".join(lines))
    failures = 0
    tried = 0
    for line, row in table or []:
        if len(row) != 3 or not numbers(row[2]):
            continue
        # The first number in the row whose altered form is in none of the
        # row's files (a changed digit can land on another real figure).
        texts = []
        for target in targets(row):
            with open(os.path.join(base, target), encoding="utf-8") as f:
                texts.append(f.read())
        for number in numbers(row[2]):
            wrong = number
            for _ in range(9):
                wrong = altered(wrong)
                if not any(occurs(wrong, t) for t in texts):
                    break
            else:
                continue
            break
        else:
            continue
        cell = row[2]
        m = next(m for m in NUMBER.finditer(cell) if m.group() == number)
        new_row = "| " + " | ".join(row[:2] + [cell[: m.start()] + wrong + cell[m.end() :]]) + " |"
        copy = lines[:]
        copy[line - 1] = new_row
        with tempfile.TemporaryDirectory() as tmp:
            copy_path = os.path.join(tmp, "README.md")
            with open(copy_path, "w", encoding="utf-8") as f:
                f.write("\n".join(copy))
            found = check(copy_path, base)
        tried += 1
        if not any(p.split(":")[1] == str(line) and f" {wrong} is in none" in p for p in found):
            print(f"self-test: line {line}: {number} changed to {wrong} was not reported")
            failures += 1
    if tried == 0:
        print("self-test: no row with a number to alter")
        failures += 1
    return failures, tried


def main(argv):
    if argv[1:2] == ["--self-test"]:
        readme = argv[2] if len(argv) > 2 else "README.md"
        failures, tried = self_test(readme)
        if failures:
            return 1
        print(f"readme_numbers: self-test: {tried} altered rows, each reported")
        return 0
    readme = argv[1] if len(argv) > 1 else "README.md"
    problems = check(readme)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
