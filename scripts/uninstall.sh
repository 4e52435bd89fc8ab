#!/usr/bin/env bash
# Removes what scripts/install.sh installed (its manifest lists the files),
# stopping the node manager first. /etc/dilu/nodemgr.toml is kept unless
# --purge: it may hold the operator's changes.
#
# usage: scripts/uninstall.sh [--purge]
# environment: PREFIX (default /usr/local), DESTDIR (a staging root; default none).
set -euo pipefail

purge=0
case ${1:-} in
  "") ;;
  --purge) purge=1 ;;
  -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
  *) echo "uninstall: unknown argument '$1' (--purge, --help)" >&2; exit 2 ;;
esac
prefix=${PREFIX:-/usr/local}
root=${DESTDIR:-}
manifest="$root$prefix/lib/dilu/install-manifest"
if [ ! -f "$manifest" ]; then
  echo "uninstall: no $manifest: dilu is not installed under PREFIX=$prefix" >&2
  exit 1
fi

unit=/etc/systemd/system/dilu-nodemgr.service
if [ -z "$root" ] && grep -qx "$unit" "$manifest" && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  echo "stopping dilu-nodemgr (tenants keep their last budgets)" >&2
  systemctl disable --now dilu-nodemgr || true
fi

while IFS= read -r path; do
  if [ "$path" = /etc/dilu/nodemgr.toml ] && [ "$purge" = 0 ]; then
    echo "kept $root$path (--purge removes it)" >&2
    continue
  fi
  rm -f "$root$path"
  echo "removed $root$path" >&2
done <"$manifest"
rm -f "$manifest"
# The simulated driver's links `dilu run --sim` made beside libsimgpu.so.
rm -rf "$root$prefix/lib/dilu/simgpu-driver"
for dir in "$root$prefix/lib/dilu" "$root/etc/dilu"; do
  rmdir "$dir" 2>/dev/null || true
done
if [ -z "$root" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
