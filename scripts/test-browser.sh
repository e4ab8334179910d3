#!/usr/bin/env bash
# The website widget's and the agent console's end-to-end tests in a real browser: tests/browser/*.test.mjs
# start the hub binary, a small website embedding the widget, and Debian's
# chromium driven by playwright-core. Installs what they need on a fresh Debian
# machine (as root), builds the hub, runs them. Screenshots of the widget land
# in target/browser-artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's chromium is the browser: playwright's own browser download needs
# hosts that CI machines may not reach, and the distribution keeps it patched.
if [ ! -x /usr/bin/chromium ]; then
    apt-get update
    apt-get install -y chromium
fi
# Firefox too: the widget must work in both. playwright-core drives only its
# own Firefox builds, so tests/browser/firefox.test.mjs uses Debian's
# firefox-esr in its headless screenshot mode instead.
if [ ! -x /usr/bin/firefox-esr ]; then
    apt-get update
    apt-get install -y firefox-esr
fi
# Node runs the tests with its built-in runner; playwright-core needs Node 20+.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    apt-get update
    apt-get install -y nodejs npm
fi
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
    echo "test-browser.sh: Node.js 20 or newer is needed (found $(node --version))" >&2
    exit 1
fi

# playwright-core only, at the version of the committed lock file; it must not
# fetch a browser of its own.
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix tests/browser --no-audit --no-fund

# The tests start target/debug/hub themselves.
cargo build -p hub --locked

# The files are named explicitly: `node --test <dir>` searches directories only
# up to Node 20, later versions take file names and globs.
node --test tests/browser/*.test.mjs
