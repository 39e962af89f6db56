#!/usr/bin/env bash
# Fuzzes flint's parsers of untrusted input with cargo-fuzz (libFuzzer), each target for a
# bounded time; any crash fails the script and leaves its input in fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh              # every target, $FLINT_FUZZ_SECONDS (default 45) seconds each
#   scripts/fuzz.sh gguf 600     # one target, ten minutes
#
# Targets (fuzz/fuzz_targets/): gguf (the reader, then the summary, model configuration,
# tokenizer and chat template built from a file), tokenizer (both real vocabularies, encode then
# decode), detokenizer (streamed pieces equal the whole decode), chat_template (both real
# templates, hostile messages), openai_request (flint serve's request parser and checks),
# tool_calls (the tool-call parser of each format: streamed pieces read as the whole text).
#
# cargo-fuzz needs nightly compiler flags (-Z sanitizer, sanitizer coverage). CI has only the
# stable toolchain, so this builds with it and RUSTC_BOOTSTRAP=1, which lets a stable compiler
# take those flags. The sanitizer is AddressSanitizer, whose runtime ships with the stable
# toolchain on x86_64 Linux. The corpus starts from the seeds in fuzz/seeds/ (committed, or written by its script) and grows
# in fuzz/corpus/ (ignored by git); the tokenizer targets read the reference models that
# scripts/fetch-models.sh fetches.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(gguf tokenizer detokenizer chat_template openai_request tool_calls)
if [ $# -ge 1 ]; then targets=("$1"); fi
seconds="${2:-${FLINT_FUZZ_SECONDS:-45}}"

if ! command -v cargo-fuzz >/dev/null; then
  echo "fuzz: cargo-fuzz is missing; scripts/setup.sh installs it (cargo install cargo-fuzz --locked)" >&2
  exit 1
fi

export RUSTUP_TOOLCHAIN="${RUSTUP_TOOLCHAIN:-stable}" RUSTC_BOOTSTRAP=1
# Overflow checks on (--debug-assertions): an arithmetic overflow on hostile input is a crash.
fuzz() {
  local command=$1
  shift
  cargo fuzz "$command" --fuzz-dir fuzz --sanitizer address --debug-assertions "$@"
}

# The gguf seeds are GGUF files, which git ignores everywhere (no model file is committed); the
# script that writes them is committed and its output is the same on every run.
python3 fuzz/seeds/make_gguf_seeds.py fuzz/seeds/gguf

echo "fuzz: building ${targets[*]}" >&2
for target in "${targets[@]}"; do
  fuzz build "$target"
done
for target in "${targets[@]}"; do
  corpus="fuzz/corpus/$target"
  mkdir -p "$corpus"
  echo "fuzz: $target for ${seconds}s" >&2
  # -rss_limit_mb and -malloc_limit_mb: an allocation that a hostile length makes larger than
  # the input justifies is a crash, not a slow run. -timeout: one input may not take 10 s.
  log="fuzz/artifacts/$target.log"
  mkdir -p fuzz/artifacts
  if ! fuzz run "$target" "$corpus" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 -max_len=65536 \
    -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz: $target failed; the input is in fuzz/artifacts/$target/, the log in $log" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units' "$log" | sed "s/^/fuzz: $target: /" >&2
done
