#!/usr/bin/env bash
# Builds the example plugins and the test suite's plugins as wasm32-wasip2
# components into target/plugins/wasm32-wasip2/release/*.wasm.
# Extra arguments go to both cargo builds.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

# A no-op when the target is installed already.
rustup --quiet target add wasm32-wasip2

# Built from inside each workspace so its .cargo/config.toml (linker flags) applies.
for workspace in plugins tests/plugins; do
    (cd "$root/$workspace" && cargo build --release --locked --target wasm32-wasip2 \
        --target-dir "$root/target/plugins" "$@")
done
