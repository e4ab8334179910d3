#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: installs what the suite
# needs (the wasm32-wasip2 target, chromium and playwright-core for the widget),
# builds the plugins, runs their native unit tests, then the hub's unit and
# end-to-end tests, then the website widget's tests in a real browser.
set -euo pipefail
cd "$(dirname "$0")/.."

# The suite's database is an embedded SQLite file and its integrators, CRMs
# and bots are loopback HTTP servers: nothing else to install.
./scripts/build-plugins.sh
./scripts/test-plugins.sh
cargo test --workspace --locked --no-fail-fast "$@"
# The widget runs in visitors' browsers, so only a browser can test it: Debian's
# chromium against the hub binary, on a page served from another origin.
./scripts/test-browser.sh
