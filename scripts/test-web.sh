#!/usr/bin/env bash
# The browser tests of the web package (crates/web/tests/browser.test.mjs): builds the package
# (scripts/build-web.sh) and the native `flint` its output is compared with, then drives the
# package in headless Chromium with its own WebGPU. scripts/setup-web.sh installs Chromium and
# playwright-core; scripts/fetch-models.sh the model.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-web.sh
bash scripts/build-web.sh
cargo build --quiet -p flint-native --bin flint
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
FLINT_BIN="${FLINT_BIN:-$target_dir/debug/flint}" node crates/web/tests/browser.test.mjs
