#!/usr/bin/env bash
# Draws deploy/grafana/dilu.json without Grafana: a node manager with three
# tenants on simgpu, its /metrics scraped every second, every panel's query
# evaluated over the scrapes (scripts/dashboard_render.py).
#                                   -> bench/results/dashboard.svg, dashboard.md
# usage: scripts/dashboard-render.sh [--debug] [SECONDS]   (default 40)
#   --debug  use the debug build (target/debug) instead of building release
# Installs matplotlib into a virtual environment under target/.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
if [ "${1:-}" = "--debug" ]; then
  profile=debug
  shift
fi
seconds=${1:-40}
packages=(-p dilu-nodemgr -p dilu-interposer -p simgpu -p simgpu-nvml)
programs=(--bin demo-tenant --bin cudarc-loop --bin mem-probe)
if [ "$profile" = release ]; then
  cargo build --release "${packages[@]}"
  cargo build --release -p dilu-tests "${programs[@]}"
else
  cargo build "${packages[@]}"
  cargo build -p dilu-tests "${programs[@]}"
fi
venv=target/render-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet matplotlib==3.10.7
fi
command="scripts/dashboard-render.sh $seconds"
[ "$profile" = debug ] && command="scripts/dashboard-render.sh --debug $seconds"
"$venv/bin/python" scripts/dashboard_render.py "target/$profile" "$seconds" \
  bench/results/dashboard.svg bench/results/dashboard.md "$command"
echo "wrote bench/results/dashboard.svg and bench/results/dashboard.md" >&2
