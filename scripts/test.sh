#!/usr/bin/env bash
# dilu's test command. The end-to-end tests start the built artifacts
# (libsimgpu.so, libdilu_interposer.so, dilu, the workloads), so every crate
# is built before any test runs.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== building the workspace"
cargo build --workspace --all-targets
echo "== running the tests"
cargo test --workspace "$@"
