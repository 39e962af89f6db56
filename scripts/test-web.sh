#!/usr/bin/env bash
# The browser tests of the web package: builds the package (scripts/build-web.sh) and the native
# `flint` its output is compared with, then drives the package in headless Chromium with its own
# WebGPU: crates/web/tests/browser.test.mjs (the API on SmolLM2), then
# crates/web/tests/large-model.test.mjs (a 1.2 GiB synthetic model loads from a URL while the
# page's renderer stays under 512 MiB; `flint synth` writes it into the cache once).
# scripts/setup-web.sh installs Chromium and playwright-core; scripts/fetch-models.sh the model.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-web.sh
bash scripts/build-web.sh
cargo build --quiet -p flint-native --bin flint
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
flint="${FLINT_BIN:-$target_dir/debug/flint}"
large_model=$(bash scripts/synth-model.sh "$flint" llama-3.2-1b q8_0)
FLINT_BIN="$flint" node crates/web/tests/browser.test.mjs
FLINT_LARGE_MODEL="$large_model" node crates/web/tests/large-model.test.mjs
