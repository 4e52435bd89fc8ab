#!/usr/bin/env bash
# dilu's test command. The end-to-end tests start the built artifacts
# (libsimgpu.so, libdilu_interposer.so, dilu, the workloads), so every crate
# is built before any test runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# The real-cudart tests (tests/tests/cudart.rs) use the runtimes that
# scripts/install-cudart.sh cached, when present; otherwise they say SKIP.
cudart_cache="${XDG_CACHE_HOME:-$HOME/.cache}/dilu/cudart"
if [[ -z "${DILU_CUDART_DIR:-}" && -f "$cudart_cache/.installed" ]]; then
  export DILU_CUDART_DIR="$cudart_cache"
fi
echo "== building the workspace"
cargo build --workspace --all-targets
echo "== running the tests"
cargo test --workspace "$@"
