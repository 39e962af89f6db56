#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, formatting, lints, the wasm32 build of the core,
# every test on a real Vulkan device (lavapipe where there is no GPU), the web package's tests in
# headless Chromium, then a bounded fuzzing run of each parser of untrusted input.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

step() { echo "==> $*" >&2; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "flint-core and flint-web for wasm32-unknown-unknown"
cargo build --quiet -p flint-core -p flint-web --target wasm32-unknown-unknown
cargo clippy --quiet -p flint-core -p flint-web --target wasm32-unknown-unknown -- -D warnings

step "cargo test --workspace"
cargo test --workspace

step "the web package in headless Chromium (scripts/test-web.sh)"
bash scripts/test-web.sh

step "fuzzing the parsers of untrusted input (scripts/fuzz.sh: ${FLINT_FUZZ_SECONDS:-45} s a target)"
bash scripts/fuzz.sh
