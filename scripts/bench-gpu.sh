#!/usr/bin/env bash
# flint beside PyTorch on a machine with a real GPU, in one run: `flint bench` (prefill, decode,
# roofline fraction, dispatches a layer; then its kernel profile and the engine at 1, 4, 16 and
# 64 streams), a greedy continuation as a correctness check, and the same model decoded by
# Hugging Face transformers from the same GGUF (scripts/bench_transformers.py) in bf16 and f32.
# Needs python3 with torch, transformers, accelerate and gguf.
#
#   scripts/bench-gpu.sh FLINT_BINARY MODEL.gguf [greedy.json from tests/reference]
#
# Every output goes to standard output and, when $BENCH_LOG_DIR is set, into files there.
set -uo pipefail
cd "$(dirname "$0")/.."

flint=${1:?usage: scripts/bench-gpu.sh FLINT_BINARY MODEL.gguf [greedy.json]}
model=${2:?usage: scripts/bench-gpu.sh FLINT_BINARY MODEL.gguf [greedy.json]}
reference=${3:-}
logs=${BENCH_LOG_DIR:-$(mktemp -d)}
name=$(basename "$model" .gguf)
status=0

step() {
    local log=$1
    shift
    echo "== $*"
    "$@" 2>&1 | tee "$logs/$name.$log.log" || status=1
}

step greedy "$flint" --quiet run --raw --temperature 0 --max-tokens 32 --model "$model" "The capital of France is"
echo
step bench "$flint" --quiet bench --model "$model" --prompt-tokens 256 --gen-tokens 128 --repeats 5
step profile "$flint" --quiet bench --model "$model" --prompt-tokens 256 --gen-tokens 32 --repeats 1 --profile
step streams "$flint" --quiet bench --model "$model" --prompt-tokens 64 --gen-tokens 64 --streams 1,4,16,64
reference_args=()
[[ -n $reference ]] && reference_args=(--reference "$reference")
step torch-bf16 python3 scripts/bench_transformers.py --model "$model" --dtype bfloat16 "${reference_args[@]}"
step torch-f32 python3 scripts/bench_transformers.py --model "$model" --dtype float32
exit $status
