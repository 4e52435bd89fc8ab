#!/usr/bin/env bash
# Installs dilu on one node: the binaries, the interposer, the systemd unit
# and an example /etc/dilu/nodemgr.toml. The Dockerfile installs its image
# with this script too, so a node and the image have one layout.
#
#   bin/dilu, bin/dilu-cluster, bin/dilu-device-plugin,
#   bin/dilu-dra-plugin                                      (PREFIX, /usr/local)
#   lib/dilu/libdilu_interposer.so                           (what `dilu run` and the device plugin preload)
#   lib/dilu/libsimgpu.so, libsimgpu_nvml.so, demo-tenant    (the simulated GPU: `dilu run --sim`, `dilu demo`)
#   /etc/systemd/system/dilu-nodemgr.service                 (unless --no-unit)
#   /etc/dilu/nodemgr.toml                                   (every key and its default, commented; an existing one is kept)
#   lib/dilu/install-manifest                                (what scripts/uninstall.sh removes)
#
# usage: scripts/install.sh [--from DIR] [--no-unit]
#   --from DIR  take the built files from DIR (default: build target/release first)
#   --no-unit   no systemd unit (containers)
# environment: PREFIX (default /usr/local), DESTDIR (a staging root; default none).
set -euo pipefail
cd "$(dirname "$0")/.."

from=""
unit=1
while [ $# -gt 0 ]; do
  case $1 in
    --from) from=${2:?--from needs a directory}; shift ;;
    --no-unit) unit=0 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "install: unknown argument '$1' (--from DIR, --no-unit, --help)" >&2; exit 2 ;;
  esac
  shift
done
prefix=${PREFIX:-/usr/local}
root=${DESTDIR:-}

if [ -z "$from" ]; then
  echo "== building dilu (release; the first build takes a few minutes)" >&2
  cargo build --release --locked -p dilu-nodemgr -p dilu-cluster -p dilu-deviceplugin -p dilu-dra-plugin \
    -p dilu-interposer -p simgpu -p simgpu-nvml
  cargo build --release --locked -p dilu-tests --bin demo-tenant
  from=target/release
fi

bins=(dilu dilu-cluster dilu-device-plugin dilu-dra-plugin)
libs=(libdilu_interposer.so libsimgpu.so libsimgpu_nvml.so demo-tenant)
for file in "${bins[@]}" "${libs[@]}"; do
  if [ ! -f "$from/$file" ]; then
    echo "install: $from/$file is missing (build it, or leave out --from to build)" >&2
    exit 1
  fi
done

manifest=()
put() { # mode source destination (under the staging root)
  install -D -m "$1" "$2" "$root$3"
  manifest+=("$3")
  echo "installed $root$3" >&2
}
for file in "${bins[@]}"; do
  put 0755 "$from/$file" "$prefix/bin/$file"
done
for file in "${libs[@]}"; do
  put 0755 "$from/$file" "$prefix/lib/dilu/$file"
done
if [ "$unit" = 1 ]; then
  unit_file=$(mktemp)
  trap 'rm -f "$unit_file"' EXIT
  sed "s|/usr/local/bin/dilu|$prefix/bin/dilu|" scripts/dilu-nodemgr.service >"$unit_file"
  put 0644 "$unit_file" /etc/systemd/system/dilu-nodemgr.service
fi
# The operator's configuration is theirs: an existing one is never replaced.
if [ -e "$root/etc/dilu/nodemgr.toml" ]; then
  echo "kept $root/etc/dilu/nodemgr.toml (the example is deploy/nodemgr.toml)" >&2
else
  put 0644 deploy/nodemgr.toml /etc/dilu/nodemgr.toml
fi
printf '%s\n' "${manifest[@]}" >"$root$prefix/lib/dilu/install-manifest"

if [ -z "$root" ] && [ "$unit" = 1 ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  echo "start the node manager with: systemctl enable --now dilu-nodemgr" >&2
fi
