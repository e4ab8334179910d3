#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: installs what the suite
# needs (the wasm32-wasip2 target, componentize-py and componentize-js,
# PostgreSQL, chromium and playwright-core),
# builds the plugins, runs their native unit tests, then the hub's unit and
# end-to-end tests on SQLite and again on PostgreSQL, then the widget's and the
# console's tests in a real browser.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each test phase's output is kept in target/test-logs/; when a phase fails,
# its failures (the `---- name stdout ----` sections with their panics) are
# printed again at the very end, where a CI excerpt of the tail shows them.
logs=target/test-logs
mkdir -p "$logs"
phase() {
    local name=$1
    shift
    if ! "$@" 2>&1 | tee "$logs/$name.log"; then
        echo "=== phase $name failed; its failures:"
        grep -A15 -e '^---- ' "$logs/$name.log" | grep -v '^stack backtrace\|^   [0-9]*: \|^             at ' | head -300
        exit 101
    fi
}

# The suite's database is an embedded SQLite file and its integrators, CRMs
# and bots are loopback HTTP servers.
./scripts/build-plugins.sh
./scripts/test-plugins.sh
# Python and TypeScript plugins: the pinned toolchains from PyPI and npm,
# cached under target/polyglot (reruns install nothing), the SDKs' and the
# examples' unit tests (pytest, node --test), the example components
# (tests/polyglot.rs runs them and the `hub plugin new --lang` projects).
./scripts/polyglot.sh build
./scripts/polyglot.sh test
# Programs some tests run, Debian's packages, installed if missing: the
# battery (tests/battery/, run by `cargo test` in its short mode) checks the
# database its crashes leave with sqlite3, and a test verifies the systemd
# unit with systemd-analyze. Without them those tests fail, so a run that
# cannot install them stops here and says so.
need_program() {
    local program="$1" package="$2"
    command -v "$program" >/dev/null && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "$0: $program is not installed (apt-get install $package)" >&2
        exit 1
    fi
    apt-get update && apt-get install -y "$package"
}
need_program sqlite3 sqlite3
need_program systemd-analyze systemd
# The tests named `slow_*` compile plugins (a new Rust crate for wasm32, the
# Python and TypeScript components of 12–19 MB: a minute or more of both
# cores on a fresh machine): they run on their own afterwards, so the
# suite's timing tests (a bot provider's 3 s retries, the spec's delivery
# timings, live streams) do not share the cores with them.
phase sqlite cargo test --workspace --locked --no-fail-fast "$@" -- --skip ::slow_
phase slow cargo test -p hub --test e2e --locked --no-fail-fast "$@" ::slow_
# The same unit and end-to-end suites on PostgreSQL: a throwaway cluster in a
# temporary directory (Debian's packages, installed if missing), removed
# afterwards. The tests that need PostgreSQL (several instances, the store's
# plans and row locks, the database outage) or systemd-analyze are
# `#[ignore = "needs …"]`, so a plain `cargo test` lists them as ignored
# rather than passing them untested: they run here. Set
# HUB_TEST_DATABASE_URL to run against a server of your own instead; the
# outage test, which stops and starts a server, then stays out.
own_server=()
if [ -n "${HUB_TEST_DATABASE_URL:-}" ]; then
    own_server=(--skip postgres::while_postgresql_is_down)
fi
phase postgres ./scripts/with-postgres.sh cargo test -p hub --lib --test e2e --locked --no-fail-fast "$@" \
    -- --include-ignored --skip ::slow_ "${own_server[@]}"
# The widget runs in visitors' browsers, so only a browser can test it: Debian's
# chromium against the hub binary, on a page served from another origin.
./scripts/test-browser.sh
