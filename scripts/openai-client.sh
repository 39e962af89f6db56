#!/usr/bin/env bash
# A Python virtual environment with the `openai` package from PyPI: the real OpenAI client that
# the `flint serve` tests drive the server with. It lives in a cache outside the repository,
# one folder per pinned version, and is built once (concurrent callers wait for each other).
# Prints the path of its python interpreter.
#
#   scripts/openai-client.sh    # -> ~/.cache/flint/python/openai-3.57.0/bin/python
#
# The cache is $FLINT_PYTHON_DIR, else ${XDG_CACHE_HOME:-~/.cache}/flint/python.
set -euo pipefail

version=3.57.0
cache="${FLINT_PYTHON_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/python}"
dir="$cache/openai-$version"
python="$dir/bin/python"
mkdir -p "$cache"

exec 9>"$dir.lock"
flock 9
if [ ! -f "$dir/.complete" ]; then
  system_python=$(command -v python3 || command -v python)
  if ! "$system_python" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "openai-client: $system_python cannot make virtual environments; install python3-venv" >&2
    exit 1
  fi
  echo "openai-client: installing openai==$version from PyPI into $dir" >&2
  rm -rf "$dir"
  "$system_python" -m venv "$dir"
  "$python" -m pip install --quiet --disable-pip-version-check "openai==$version"
  touch "$dir/.complete"
fi
echo "$python"
