#!/usr/bin/env bash
# flint against llama.cpp's own Vulkan backend on the same device, model, prompt length and
# generation length, in one run: the two alternate, each timed several times, and a table of
# both and their ratio is printed (markdown, ready for BENCHMARKS.md). llama.cpp is the prebuilt
# Vulkan backend of the cyllama-vulkan wheel (PyPI) with every layer offloaded; flint is the
# release build of `flint bench`. On a machine whose only Vulkan device is lavapipe, llama.cpp
# needs GGML_VK_VISIBLE_DEVICES=0 (set here unless given); FLINT_ADAPTER picks flint's adapter.
#
#   scripts/compare-llama-cpp-vulkan.sh [--model FILE] [--prompt-tokens 256] [--gen-tokens 128] [--repeats 3]
#
# The model defaults to SmolLM2-135M-Instruct Q4_1 in the model cache (scripts/fetch-models.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# The wheel ships CPython 3.10-3.13 builds.
python=$(bash scripts/python-env.sh cyllama-vulkan-0.2.18 cyllama-vulkan==0.2.18)
cargo build --release --quiet -p flint-native
GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} \
  exec "$python" scripts/compare_llama_cpp.py --backend vulkan --flint target/release/flint "$@"
