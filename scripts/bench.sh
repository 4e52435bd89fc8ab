#!/usr/bin/env bash
# Builds what the benchmarks load (release) and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p simgpu -p dilu-interposer
cargo bench -p dilu-bench --bench overhead "$@"
