#!/usr/bin/env bash
# Checks that the interposer's module groups form layers: a module in
# interposer/src/ uses (`crate::...` outside comments) only its own group and
# the groups listed after it below. Prints every edge that reaches back up
# and exits 1 if there is one. CI (.ci/run) runs it.
set -euo pipefail
cd "$(dirname "$0")/../interposer/src"
# Top to bottom (lib.rs, the crate root, is above them all).
order=(entry telemetry memory sm_time fork node driver table config)
rank() {
  local i
  for i in "${!order[@]}"; do
    [[ "${order[$i]}" == "$1" ]] && { echo "$i"; return; }
  done
  echo "unknown group '$1'" >&2
  exit 2
}
status=0
while IFS= read -r file; do
  [[ "$file" == lib.rs ]] && continue
  group=${file%%/*}
  group=${group%.rs}
  mine=$(rank "$group")
  # Code lines only (no // comments), then every crate:: path's first segment.
  for used in $(sed -e 's://.*$::' "$file" | grep -o 'crate::[a-z_]*' | sed 's/crate:://' | sort -u); do
    [[ -z "$used" || "$used" == "$group" || "$used" == CUresult ]] && continue
    theirs=$(rank "$used")
    if (( theirs < mine )); then
      echo "interposer/src/$file ($group) reaches back up to $used"
      status=1
    fi
  done
done < <(find . -name '*.rs' | sed 's:^\./::' | sort)
if (( status == 0 )); then
  echo "interposer groups: no module reaches back up (${order[*]})"
fi
exit "$status"
