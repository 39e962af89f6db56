#!/usr/bin/env bash
# Loading a large model in the browser against loading it natively (not part of CI; slow): a
# synthetic model (`flint synth`, by default Llama-3.1-8B Q4_K_M, 4.6 GB, written into the cache
# once by scripts/synth-model.sh) loaded in headless Chromium on SwiftShader from a URL, then a
# few tokens generated greedily (crates/web/tests/bench-large.mjs), with and without the Cache
# API; then `flint bench` on the same file (on the default adapter: lavapipe where there is no
# GPU). Prints the load time and bytes/s, the peak resident memory of the page's renderer, of all
# of Chromium together (sampled), and of native flint's process.
#
#   scripts/bench-web-large.sh [MODEL (llama-3.1-8b)] [QUANT (q4_k_m)] [TOKENS (4)]
#
# SwiftShader runs an 8B model's forward pass in tens of seconds on two cores: keep TOKENS small.
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:-llama-3.1-8b}
quant=${2:-q4_k_m}
tokens=${3:-4}

bash scripts/setup-web.sh
bash scripts/build-web.sh >&2
cargo build --release --quiet -p flint-native
flint=target/release/flint
file=$(bash scripts/synth-model.sh "$flint" "$model" "$quant")

echo "bench-web-large: $file in headless Chromium, through the Cache API..." >&2
cached=$(node crates/web/tests/bench-large.mjs "$file" "$tokens" cache)
echo "bench-web-large: ... and without it (cache: false, a temporary file)..." >&2
uncached=$(node crates/web/tests/bench-large.mjs "$file" "$tokens" no-cache)
echo "bench-web-large: native flint bench..." >&2
# `flint bench` reports its load time; its peak resident memory is the child's ru_maxrss.
native=$(python3 - "$flint" bench --model "$file" --prompt-tokens 8 --gen-tokens "$tokens" --repeats 1 --json <<'PY'
import json, resource, subprocess, sys
report = json.loads(subprocess.run(sys.argv[1:], check=True, stdout=subprocess.PIPE).stdout)
report["peak_resident_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps(report))
PY
)

python3 - "$cached" "$uncached" "$native" <<'PY'
import json, sys
cached, uncached, native = (json.loads(arg) for arg in sys.argv[1:])
mib = lambda b: f"{b / 2**20:.0f} MiB"
rate = lambda b, s: f"{b / s / 1e6:.0f} MB/s"
print(f"{cached['file']}: {cached['bytes'] / 1e9:.2f} GB; browser: 'Hello' + {cached['tokens']} greedy tokens")
print("| load | load s | load rate | download s | upload s | renderer peak | all of Chromium, peak | tokens s |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for name, r in (("Chromium, URL via the Cache API", cached), ("Chromium, URL into a temporary file (cache: false)", uncached)):
    print(f"| {name} | {r['loadS']:.1f} | {rate(r['bytes'], r['loadS'])} | {r['downloadS']:.1f} | {r['uploadS']:.1f} "
          f"| {mib(r['rendererPeakBytes'])} | {mib(r['totalPeakBytes'])} | {r['generateS']:.1f} |")
print(f"| native flint bench ({native['adapter']}) | {native['load_s']:.1f} | {rate(cached['bytes'], native['load_s'])} | - | - "
      f"| - | {mib(native['peak_resident_bytes'])} (the process) | - |")
print("Chromium's processes, peak resident (through the Cache API): "
      + ", ".join(f"{p['type']} {mib(p['peak'])}" for p in cached["processes"]))
PY
