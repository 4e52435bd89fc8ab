#!/usr/bin/env bash
# dilu's main job on any machine: build everything (release) and run the
# demo on the simulated GPU. Arguments go to `dilu demo` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== building dilu (release; the first build takes a few minutes)" >&2
cargo build --release --workspace --bins --lib
exec target/release/dilu demo "$@"
