#!/usr/bin/env bash
# Checks README.md and docs/*.md: README.md has at most 400 lines; neither
# names a commit or says "ad hoc" (history belongs to git); every relative
# link names a file that exists; every number in README.md's results table
# is in a results file its row links to (scripts/readme_numbers.py, which
# also tests itself here); docs/configuration.md names every DILU_*
# variable the code reads, and no other; ARCHITECTURE.md and the crates'
# READMEs name source files that exist. One line per problem; exit 1 if
# there is any.
set -euo pipefail
cd "$(dirname "$0")/.."

max_lines=400
problems=0
problem() {
  echo "readme-check: $*" >&2
  problems=$((problems + 1))
}

lines=$(wc -l < README.md)
if (( lines > max_lines )); then
  problem "README.md has $lines lines (at most $max_lines)"
fi

# A commit hash: 7 to 40 lowercase hex digits standing alone, with at least
# one digit and one letter (so plain numbers and words are not taken for
# one). History belongs to git: neither README.md nor docs/ names commits.
ad_hoc='\bad[[:space:]-]+hoc\b'
for file in README.md docs/*.md; do
  [[ -e $file ]] || continue
  while IFS= read -r hit; do
    line=${hit%%:*}
    word=${hit#*:}
    if [[ $word =~ [0-9] && $word =~ [a-f] ]]; then
      problem "$file:$line: looks like a commit hash: $word"
    fi
  done < <(grep -noE '\b[0-9a-f]{7,40}\b' "$file" || true)
  while IFS= read -r hit; do
    problem "$file:${hit%%:*}: says \"ad hoc\""
  done < <(grep -niE "$ad_hoc" "$file" || true)
  if ! grep -qiE "$ad_hoc" "$file" && tr '\n' ' ' < "$file" | grep -qiE "$ad_hoc"; then
    problem "$file: says \"ad hoc\" across a line break"
  fi
done

# Relative links: [text](target), target without a scheme; the part after
# '#' is an anchor and is not checked.
for file in README.md docs/*.md; do
  [[ -e $file ]] || continue
  dir=$(dirname "$file")
  while IFS= read -r hit; do
    line=${hit%%:*}
    link=${hit#*:}
    target=${link#*](}
    target=${target%)}
    target=${target%%#*}
    target=${target%% *}
    case $target in
      '' | http://* | https://* | mailto:*) continue ;;
    esac
    if [[ ! -e $dir/$target ]]; then
      problem "$file:$line: link to $target: no such file"
    fi
  done < <(grep -noE '\]\([^)]+\)' "$file" || true)
done

# README figures are quoted from the files that hold them, never typed: each
# number in the results table's third column is in a file that row links to.
# The self-test alters one number a row in a copy and expects each reported,
# so a checker that stopped reading the table would fail here too. A crash
# counts as a problem (its message is the line).
for args in README.md --self-test; do
  if ! out=$(python3 scripts/readme_numbers.py $args 2>&1); then
    while IFS= read -r hit; do
      problem "$hit"
    done <<< "$out"
  fi
done

# Every DILU_* variable the code names is in the configuration reference.
while IFS= read -r var; do
  grep -q "\b$var\b" docs/configuration.md || problem "docs/configuration.md: $var is read by the code but not documented"
done < <(grep -rhoE --include='*.rs' --exclude-dir=target '"DILU_[A-Z0-9_]*[A-Z0-9]"' . | tr -d '"' | sort -u)

# ... and every DILU_* variable it documents is still read by some code or
# script (a removed variable goes from the reference too).
while IFS= read -r var; do
  grep -rqE --include='*.rs' --include='*.sh' --include='*.py' --exclude-dir=target "\b$var\b" . \
    || problem "docs/configuration.md: $var is documented but nothing reads it"
done < <(grep -oE '\bDILU_[A-Z0-9_]*[A-Z0-9]\b' docs/configuration.md | sort -u)

# ARCHITECTURE.md and the crates' READMEs name source files that exist: a
# backticked path with a slash, ending in .rs (any `::item` after it cut),
# found from the repository root, a crate's folder or its src/.
while IFS= read -r missing; do
  problem "$missing"
done < <(python3 - <<'PY'
import glob, os, re
roots = [""] + sorted(p.rstrip("/") + "/" for p in glob.glob("*/src") + glob.glob("*/*/src") + glob.glob("*/"))
for doc in ["ARCHITECTURE.md"] + sorted(glob.glob("*/README.md")):
    for number, line in enumerate(open(doc, encoding="utf-8"), 1):
        for token in re.findall(r"`([\w./-]+/[\w.-]+\.rs)(?:::[\w:]+)?`", line):
            if not any(os.path.exists(root + token) for root in roots):
                print(f"{doc}:{number}: names {token}, which does not exist")
PY
)

if (( problems > 0 )); then
  echo "readme-check: $problems problem(s)" >&2
  exit 1
fi
echo "readme-check: README.md ($lines lines) and docs/*.md pass"
