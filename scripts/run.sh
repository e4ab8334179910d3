#!/usr/bin/env bash
# Runs the hub with ./hub.toml on a fresh machine: builds the example plugins
# the default configuration wires, then the hub itself, then serves.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build-plugins.sh
exec cargo run --release --locked -p hub -- serve "$@"
