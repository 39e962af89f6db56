#!/usr/bin/env bash
# What the browser tests need (scripts/test-web.sh): Debian's Chromium, whose WebGPU runs on
# SwiftShader without a GPU, and playwright-core from npm (crates/web/package-lock.json) to
# drive it; and the `openai` npm package, the real OpenAI client for Node that
# crates/web/tests/openai-node.mjs drives `flint serve` with. Idempotent and quiet when all are
# present.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ ! -x /usr/bin/chromium ]; then
  echo "setup: installing Debian's chromium (the browser tests' WebGPU)" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

if ! command -v npm >/dev/null; then
  echo "setup: installing Node.js and npm (the browser tests' driver)" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

if [ ! -f crates/web/node_modules/playwright-core/package.json ] || [ ! -f crates/web/node_modules/openai/package.json ]; then
  echo "setup: installing playwright-core and openai from npm into crates/web/node_modules" >&2
  (cd crates/web && npm ci --no-audit --no-fund --loglevel=error)
fi
