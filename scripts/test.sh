#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the suite
# needs, then runs unit and end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Nothing beyond the Rust toolchain is needed yet: the suite's database is an
# embedded SQLite file and its integrators are loopback HTTP servers.
cargo test --workspace --locked "$@"
