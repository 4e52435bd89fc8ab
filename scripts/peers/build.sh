#!/usr/bin/env bash
# Builds the field's GPU-sharing systems whose source variables are set, each
# with its own script in scripts/peers/, and prints one `export` line naming
# what was built, for the field benchmark (bench/src/peers/) to find:
#
#   eval "$(HAMI_CORE_SRC=... TGS_SRC=... XSCHED_SRC=... scripts/peers/build.sh)"
#
# HAMI_CORE_SRC  HAMi-core checkout -> scripts/peers/hami-core.sh -> DILU_PEER_HAMI
#                (the built libvgpu.so)
# TGS_SRC        TGS checkout -> scripts/peers/tgs.sh -> DILU_PEER_TGS (the folder
#                with high/, low/ and driver/)
# XSCHED_SRC     XSched checkout -> scripts/peers/xsched.sh -> DILU_PEER_XSCHED
#                (skipped with a message while that script does not exist)
# PEERS_CACHE    passed on (default target/peers-cache)
#
# Each script prints the value of its variable as the last line on stdout and
# its progress on stderr; none downloads a peer's code. A peer whose variable
# is unset is skipped with a message; a failed build stops this script. The
# line printed is `export DILU_PEER_HAMI=... DILU_PEER_TGS=...` (only those
# built; nothing when none was).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

case ${1:-} in
  -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$here/build.sh"; exit 0 ;;
  "") ;;
  *) echo "peers/build: unknown argument '$1'" >&2; exit 2 ;;
esac

exports=()
# build NAME SOURCE_VARIABLE SCRIPT PEER_VARIABLE
build() {
  local name=$1 source_var=$2 script=$here/$3 peer_var=$4 value
  if [ -z "${!source_var:-}" ]; then
    echo "peers/build: $name skipped: $source_var is not set" >&2
    return
  fi
  if [ ! -f "$script" ]; then
    echo "peers/build: $name skipped: ${script#"$here/"} does not exist yet" >&2
    return
  fi
  echo "peers/build: $name from ${!source_var}" >&2
  value=$(bash "$script" | tail -n 1)
  [ -n "$value" ] || { echo "peers/build: $name: ${script#"$here/"} printed nothing" >&2; exit 1; }
  exports+=("$peer_var=$(printf '%q' "$value")")
}

build HAMi-core HAMI_CORE_SRC hami-core.sh DILU_PEER_HAMI
build TGS TGS_SRC tgs.sh DILU_PEER_TGS
build XSched XSCHED_SRC xsched.sh DILU_PEER_XSCHED

if [ ${#exports[@]} -gt 0 ]; then
  echo "export ${exports[*]}"
else
  echo "peers/build: nothing built (set HAMI_CORE_SRC, TGS_SRC or XSCHED_SRC)" >&2
fi
