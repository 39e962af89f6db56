#!/usr/bin/env bash
# flint against llama.cpp on the same GGUF file, prompt length and generation length, in one
# run: the two alternate, each timed several times, and a table of both and their ratio is
# printed (markdown, ready for BENCHMARKS.md). llama.cpp is llama-cpp-python from PyPI, built
# from source for this CPU by scripts/llama-cpp.sh, with as many threads as the machine has
# cores; flint is the release build of `flint bench` on the machine's GPU (lavapipe here).
#
#   scripts/compare-llama-cpp.sh [--model FILE] [--prompt-tokens 256] [--gen-tokens 128] [--repeats 3]
#
# The model defaults to SmolLM2-135M-Instruct Q4_1 in the model cache (scripts/fetch-models.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

python=$(bash scripts/llama-cpp.sh)
cargo build --release --quiet -p flint-native
exec "$python" scripts/compare_llama_cpp.py --flint target/release/flint "$@"
