#!/usr/bin/env bash
# Runs the example plugins' unit tests natively (no wasm runtime needed);
# plugin-api's own tests run with the root workspace.
# Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --locked --manifest-path plugins/Cargo.toml \
    --target-dir target/plugins-native "$@"
