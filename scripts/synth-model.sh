#!/usr/bin/env bash
# Writes a synthetic model (`flint synth`: random weights at a real model's shapes and types)
# into the cache, once, and prints its path. The same name, mix and seed give the same file,
# so a file already there is kept; it is written under a temporary name and renamed when
# complete, so a file there is a whole one.
#
#   scripts/synth-model.sh FLINT MODEL QUANT      e.g. target/release/flint llama-3.2-1b q8_0
#
# The folder: FLINT_SYNTH_DIR, by default ~/.cache/flint/synthetic (XDG_CACHE_HOME is honoured).
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: scripts/synth-model.sh FLINT MODEL QUANT" >&2
  exit 2
fi
flint=$1
model=$2
quant=$3
dir=${FLINT_SYNTH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/synthetic}
file="$dir/$model.$quant.synthetic.gguf"
if [ ! -f "$file" ]; then
  mkdir -p "$dir"
  "$flint" synth --model "$model" --quant "$quant" --output "$file.partial" >&2
  mv "$file.partial" "$file"
fi
echo "$file"
