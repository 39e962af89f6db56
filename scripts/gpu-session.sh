#!/usr/bin/env bash
# One run on a lent GPU machine (no network there): what issue 27 and 28 ask to measure on a
# real GPU, with the release `flint` built here and carried over, and models synthesized there
# (`flint synth`: a SmolLM2-135M and a Llama-3.2-1B of the real shapes and types).
#
#   scripts/gpu-session.sh FLINT_BINARY [CYLLAMA_WHEEL_DIR]
#
# With the device tool: build `cargo build --release -p flint-native`, put the wheel for the
# machine's Python in an ignored folder of the checkout (the release binary, 18 MB, and one
# wheel, 31 MB, fit the 64 MiB it carries), carry both, and run
# `scripts/gpu-session.sh target/release/flint WHEEL_FOLDER` with $OUT set. Tried end to end on
# lavapipe here (GGML_VK_VISIBLE_DEVICES=0, GPU_SESSION_MODELS=smollm2-135m:q8_0): 9 minutes.
#
# For each model: `flint bench` at 1 and 16 sequences (host time a step, objects created a
# step), its kernel profile (the GPU's idle share of a step), and the engine at 1 and 16
# streams with overlapped steps on and off. With a folder of cyllama-vulkan wheels (`pip
# download --no-deps --only-binary=:all: --python-version 3.X cyllama-vulkan==0.2.18`), also
# llama.cpp's Vulkan backend on the same files (scripts/compare_llama_cpp.py). Everything goes
# to standard output and, when $OUT is set, into a log a model there (few files: the device
# tool returns at most 8). $GPU_SESSION_MODELS overrides the
# models (`name:quant` pairs, as `flint synth --list` names them).
set -uo pipefail
cd "$(dirname "$0")/.."

flint=${1:?usage: scripts/gpu-session.sh FLINT_BINARY [CYLLAMA_WHEEL_DIR]}
wheels=${2:-}
out=${OUT:-$(mktemp -d)}
models=$(mktemp -d)
specs=${GPU_SESSION_MODELS:-smollm2-135m:q8_0 llama-3.2-1b:q4_k_m}
status=0

step() {
    local log=$1
    shift
    echo "== $*" | tee -a "$out/$log.log"
    timeout 300 "$@" 2>&1 | tee -a "$out/$log.log" || status=1
}

step gpu "$flint" gpu --json
for spec in $specs; do
    model=${spec%%:*}
    quant=${spec##*:}
    file="$models/$model.$quant.gguf"
    step "$model" "$flint" synth --model "$model" --quant "$quant" --output "$file"
    step "$model" "$flint" -q bench --model "$file" --prompt-tokens 128 --gen-tokens 32 --repeats 3 --json
    step "$model" "$flint" -q bench --model "$file" --prompt-tokens 128 --gen-tokens 32 --concurrency 16 --repeats 3 --json
    step "$model" "$flint" -q bench --model "$file" --prompt-tokens 128 --gen-tokens 16 --repeats 1 --profile
    for overlap in on off; do
        step "$model" "$flint" -q bench --model "$file" --prompt-tokens 64 --gen-tokens 64 \
            --streams 1,16 --repeats 3 --overlap "$overlap"
    done
done

if [[ -n $wheels ]]; then
    tag=$(python3 -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    wheel=$(ls "$wheels"/cyllama_vulkan-*-"$tag"-*.whl 2>/dev/null | head -1)
    if [[ -z $wheel ]]; then
        echo "gpu-session: no cyllama-vulkan wheel for $tag in $wheels" >&2
        status=1
    else
        python3 -m venv "$models/venv" && "$models/venv/bin/pip" install --quiet --no-index "$wheel"
        for spec in $specs; do
            model=${spec%%:*}
            step "llama-cpp-$model" "$models/venv/bin/python" scripts/compare_llama_cpp.py --backend vulkan \
                --flint "$flint" --model "$models/$model.${spec##*:}.gguf" --prompt-tokens 128 --gen-tokens 32 --repeats 3
        done
    fi
fi
rm -f "$models"/*.gguf
exit $status
