#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, formatting, lints (native and wasm32),
# every test on a real Vulkan device (lavapipe where there is no GPU), the web package's tests in
# headless Chromium, then a bounded fuzzing run of each parser of untrusted input.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time is printed when the next one starts, and the whole run's at the end, so the
# log shows where CI's time goes.
started=$SECONDS
step_started=$SECONDS
step_name="set-up (scripts/setup.sh)"
step_done() { echo "<== $step_name: $((SECONDS - step_started)) s" >&2; }
step() {
  step_done
  step_name=$*
  step_started=$SECONDS
  echo "==> $*" >&2
}
trap 'step_done; echo "<== total: $((SECONDS - started)) s" >&2' EXIT

echo "==> $step_name" >&2
bash scripts/setup.sh

step "cargo fmt --check"
cargo fmt --all --check

# With the kernel timings (`crates/core/benches/kernels.rs`), so that they keep building.
step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --features flint-core/kernel-timing --quiet -- -D warnings

# Clippy type-checks the wasm32 build; the browser tests below build and run its release form.
step "cargo clippy for wasm32-unknown-unknown (flint-core, flint-web)"
cargo clippy --quiet -p flint-core -p flint-web --target wasm32-unknown-unknown -- -D warnings

step "cargo test --workspace"
cargo test --workspace

step "the web package in headless Chromium (scripts/test-web.sh)"
bash scripts/test-web.sh

step "fuzzing the parsers of untrusted input (scripts/fuzz.sh: ${FLINT_FUZZ_SECONDS:-45} s a target)"
bash scripts/fuzz.sh
