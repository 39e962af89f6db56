#!/usr/bin/env bash
# Decode speed of the web package in headless Chromium against native flint on the same device:
# Chromium's WebGPU runs on SwiftShader where there is no GPU, and native flint runs on
# SwiftShader too through Chromium's Vulkan driver (VK_ICD_FILENAMES). Both measure one greedy
# stream through the engine the same way (`flint bench --streams 1`; the page
# crates/web/bench/index.html), with the same prompt ids, after a warm-up run; prints both
# figures and the browser/native ratio.
#
#   scripts/bench-web.sh [PROMPT_TOKENS (16)] [GEN_TOKENS (16)] [REPEATS (2)]
#
# SwiftShader decodes SmolLM2-135M at well under a token per second on two cores: keep the
# workload small.
set -euo pipefail
cd "$(dirname "$0")/.."

prompt_tokens=${1:-16}
gen_tokens=${2:-16}
repeats=${3:-2}
icd=/usr/lib/chromium/vk_swiftshader_icd.json

bash scripts/setup-web.sh
bash scripts/build-web.sh >&2
cargo build --release --quiet -p flint-native
if [ ! -f "$icd" ]; then
  echo "bench-web: Chromium's SwiftShader Vulkan driver ($icd) is missing" >&2
  exit 1
fi
flint=target/release/flint

# The prompt native bench uses: the Apache License's tokens, cycled.
ids=$("$flint" tokenize --text "$(cat /usr/share/common-licenses/Apache-2.0)" |
  python3 -c "import json, sys; ids = json.load(sys.stdin); n = $prompt_tokens; print(','.join(str(ids[i % len(ids)]) for i in range(n)))")

echo "bench-web: native flint on SwiftShader..." >&2
native=$(VK_ICD_FILENAMES="$icd" "$flint" bench --streams 1 --prompt-tokens "$prompt_tokens" \
  --gen-tokens "$gen_tokens" --repeats "$repeats" --json)
echo "bench-web: the package in headless Chromium..." >&2
browser=$(node crates/web/tests/bench.mjs "$prompt_tokens" "$gen_tokens" "$repeats" "$ids")

python3 - "$native" "$browser" <<'PY'
import json, sys
native, browser = json.loads(sys.argv[1]), json.loads(sys.argv[2])
n = native["streams"][0]["decode_tokens_per_s"]
b = browser["decodeTokensPerS"]
print(f"workload: {browser['promptTokens']} prompt + {browser['genTokens']} generated tokens, one greedy stream, median of {browser['repeats']} runs")
print("| engine | adapter | decode tokens/s | first token s |")
print("| --- | --- | --- | --- |")
print(f"| native flint (Vulkan) | {native['adapter']} | {n:.3f} | {native['streams'][0]['time_to_first_token_s']:.2f} |")
print(f"| flint in Chromium (WebGPU) | {browser['adapter'] or 'browser adapter'} ({browser['backend']}) | {b:.3f} | {browser['firstTokenS']:.2f} |")
print(f"browser / native decode: {b / n:.2f}")
PY
