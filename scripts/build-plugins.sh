#!/usr/bin/env bash
# Builds the example plugins and the test suite's fault plugin as wasm32-wasip2
# components into target/plugins/wasm32-wasip2/release/*.wasm.
# Extra arguments go to both cargo builds.
set -euo pipefail
cd "$(dirname "$0")/.."

# A no-op when the target is installed already.
rustup --quiet target add wasm32-wasip2

for manifest in plugins/Cargo.toml tests/plugins/Cargo.toml; do
    cargo build --release --locked --target wasm32-wasip2 \
        --target-dir target/plugins --manifest-path "$manifest" "$@"
done
