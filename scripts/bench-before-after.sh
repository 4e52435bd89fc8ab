#!/usr/bin/env bash
# Runs benchmarks on an earlier commit and on the working tree, one after
# the other in one run (same machine, same load), and puts each results
# file beside its earlier version: every changed cell of its tables reads
# "before → after" (scripts/results_before_after.py --before-dir).
#
#   scripts/bench-before-after.sh REV BENCH [BENCH...] [--printed] [--out FILE] [-- ARGS]
#   scripts/bench-before-after.sh main~3 sm control-period
#
# REV is checked out (detached) into target/before-after/tree and built
# there (its own target/ inside it), so the two builds never mix; each side runs `scripts/bench.sh BENCH` of its
# own tree (ARGS go to every benchmark named). The earlier side's results
# files stay in its tree; the working tree's are written as usual; what
# each side printed is kept in target/before-after/BENCH-{before,after}.log;
# --printed compares those instead of the results files (for arguments that
# make a benchmark print its tables instead of writing its file, e.g.
# `colocation -- --class-only`). The comparison is printed and written to
# target/before-after/REPORT.md (--out FILE for another place).
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case $1 in -h | --help) usage; exit 0 ;; esac
# This run as a command line, for the report's header.
invocation="scripts/bench-before-after.sh$(printf ' %q' "$@")"
rev=$1
shift
benches=()
out=target/before-after/REPORT.md
printed=
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --printed) printed=yes; shift ;;
    *) benches+=("$1"); shift ;;
  esac
done
[ "${1:-}" = "--" ] && shift
[ ${#benches[@]} -gt 0 ] || { echo "bench-before-after: name at least one benchmark" >&2; exit 2; }
# Resolved here: in the scratch tree, a name like HEAD would mean its own.
commit=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "bench-before-after: $rev is not a commit" >&2; exit 2; }

# Each benchmark's results files (what scripts/bench.sh writes for it), one
# per line.
results_of() {
  case $1 in
    sm) echo bench/results/sm-accuracy.md ;;
    overhead) printf '%s\n' bench/results/overhead.md bench/results/overhead-sm-launch.md ;;
    instructions) echo bench/results/launch-instructions.md ;;
    *) echo "bench/results/$1.md" ;;
  esac
}

base=$PWD/target/before-after
tree=$base/tree
mkdir -p "$base"
# The tree is scratch: results an earlier run wrote there are discarded
# (without --force the checkout refused, and the old commit was measured).
if [ -d "$tree" ]; then
  git -C "$tree" checkout --quiet --force --detach "$commit"
else
  git worktree add --quiet --detach "$tree" "$commit"
fi || { echo "bench-before-after: cannot check out $rev in $tree" >&2; exit 1; }
[ "$(git -C "$tree" rev-parse HEAD)" = "$commit" ] || { echo "bench-before-after: $tree is not at $rev" >&2; exit 1; }
echo "== before: $rev ($(git rev-parse --short "$commit")) in $tree" >&2
for bench in "${benches[@]}"; do
  (cd "$tree" && scripts/bench.sh "$bench" -- "$@") 2>&1 | tee "$base/$bench-before.log" ||
    echo "bench-before-after: $bench failed before" >&2
done
echo "== after: the working tree" >&2
for bench in "${benches[@]}"; do
  scripts/bench.sh "$bench" -- "$@" 2>&1 | tee "$base/$bench-after.log" ||
    echo "bench-before-after: $bench failed after" >&2
done
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
if [ -n "$printed" ]; then
  # What each side printed, as markdown files of one name in two folders.
  mkdir -p "$base/printed/before" "$base/printed/after"
  names=()
  for bench in "${benches[@]}"; do
    cp "$base/$bench-before.log" "$base/printed/before/$bench.md"
    cp "$base/$bench-after.log" "$base/printed/after/$bench.md"
    names+=("$bench.md")
  done
  (cd "$base/printed/after" && python3 "$OLDPWD/scripts/results_before_after.py" --before-dir ../before --label "$rev" --run "$invocation" "${names[@]}") | tee "$out"
else
  files=()
  for bench in "${benches[@]}"; do mapfile -t -O "${#files[@]}" files < <(results_of "$bench"); done
  python3 scripts/results_before_after.py --before-dir "$tree" --label "$rev" --run "$invocation" "${files[@]}" | tee "$out"
fi
echo "bench-before-after: written to $out" >&2
