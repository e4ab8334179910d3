#!/usr/bin/env bash
# Python and TypeScript plugins: installs the pinned toolchains (PyPI, npm)
# once into target/polyglot (reruns reuse them), then
#   ./scripts/polyglot.sh build   builds the SDK examples and the Python fault plugin
#                                 into target/plugins/polyglot/*.wasm
#   ./scripts/polyglot.sh test    runs the SDKs' and the examples' unit tests (pytest, node --test)
#   ./scripts/polyglot.sh tools   only installs the toolchains
# The versions here are the ones `hub plugin new --lang …` writes into a project.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

COMPONENTIZE_PY=0.25.1
PYTEST=8.4.2
tools="$root/target/polyglot"
venv="$tools/py-$COMPONENTIZE_PY"
out="$root/target/plugins/polyglot"
node_bin="$root/sdk/typescript/node_modules/.bin"
# npm's download cache under target/ too: a rerun installs offline from it.
export npm_config_cache="$tools/npm-cache"

install_tools() {
    if [ ! -x "$venv/bin/componentize-py" ]; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        # Wheels only: the sdist would download a CPython build from outside the registries.
        "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: \
            "componentize-py==$COMPONENTIZE_PY" "pytest==$PYTEST"
    fi
    # package-lock.json pins every package; `npm ci` only when it changed.
    local lock="$root/sdk/typescript/package-lock.json"
    local stamp="$root/sdk/typescript/node_modules/.hub-lock"
    if [ ! -f "$stamp" ] || ! cmp -s "$lock" "$stamp"; then
        (cd "$root/sdk/typescript" && npm ci --no-audit --no-fund --loglevel=error)
        cp "$lock" "$stamp"
    fi
}

# build_py NAME DIR MODULE: a Python plugin module into $out/NAME.wasm.
build_py() {
    "$venv/bin/componentize-py" -d "$root/plugin-api/wit" -w plugin componentize \
        -p "$root/sdk/python" -p "$2" "$3" -o "$out/$1.wasm" >/dev/null
}

# build_ts NAME DIR: DIR/src/plugin.ts (its default export) into $out/NAME.wasm.
build_ts() {
    local dir="$tools/ts-build"
    mkdir -p "$dir"
    printf 'import plugin from "%s/src/plugin.ts";\nimport { exportPlugin } from "@hub/plugin/guest";\nexport const { handle, validateConfig, needsFor } = exportPlugin(plugin);\n' \
        "$2" >"$dir/$1.entry.ts"
    "$node_bin/esbuild" "$dir/$1.entry.ts" --bundle --format=esm --platform=neutral \
        --log-level=warning --tsconfig="$2/tsconfig.json" --external:'hub:plugin/*' \
        --outfile="$dir/$1.js"
    "$node_bin/componentize-js" "$dir/$1.js" -w "$root/plugin-api/wit" -n plugin \
        -d http fetch-event clocks -o "$out/$1.wasm" >/dev/null
}

# stale OUT INPUT...: whether OUT is missing or older than a file of the inputs.
stale() {
    local target="$1"
    shift
    [ ! -f "$target" ] || [ -n "$(find "$@" -newer "$target" -not -path '*/node_modules/*' \
        -not -path '*/__pycache__/*' -print -quit)" ]
}

build() {
    mkdir -p "$out"
    local wit="$root/plugin-api/wit"
    if stale "$out/spam_guard_py.wasm" "$wit" "$root/sdk/python/hub_plugin" "$root/plugins/spam-guard-py"; then
        build_py spam_guard_py "$root/plugins/spam-guard-py" spam_guard
    fi
    if stale "$out/fault_py.wasm" "$wit" "$root/sdk/python/hub_plugin" "$root/tests/plugins/fault-py"; then
        build_py fault_py "$root/tests/plugins/fault-py" fault
    fi
    if stale "$out/spam_guard_ts.wasm" "$wit" "$root/sdk/typescript/src" "$root/plugins/spam-guard-ts"; then
        build_ts spam_guard_ts "$root/plugins/spam-guard-ts"
    fi
}

unit_tests() {
    # The payload types are what the schema of plugin-api's types makes.
    python3 "$root/sdk/gen_payloads.py" --check
    PYTHONPATH="$root/sdk/python:$root/plugins/spam-guard-py" "$venv/bin/python" -m pytest -q \
        -p no:cacheprovider "$root/sdk/python/tests" "$root/plugins/spam-guard-py/tests"
    local t="$tools/ts-test"
    rm -rf "$t" && mkdir -p "$t"
    for project in sdk/typescript plugins/spam-guard-ts; do
        "$node_bin/tsc" -p "$root/$project/tsconfig.json"
        for f in "$root/$project"/test/*.test.ts; do
            "$node_bin/esbuild" "$f" --bundle --platform=node --format=esm --log-level=warning \
                --tsconfig="$root/$project/tsconfig.json" \
                --outfile="$t/$(basename "$project")-$(basename "$f" .ts).mjs"
        done
    done
    node --test "$t"/
}

install_tools
case "${1:-build}" in
    tools) ;;
    build) build ;;
    test) unit_tests ;;
    *) echo "usage: $0 [tools|build|test]" >&2; exit 2 ;;
esac
