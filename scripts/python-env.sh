#!/usr/bin/env bash
# A Python virtual environment with pinned packages from PyPI, in a cache outside the
# repository, built once (concurrent callers wait for each other); prints the path of its
# python interpreter. The tools that need Python (scripts/llama-cpp.sh, scripts/openai-client.sh)
# are built on it.
#
#   scripts/python-env.sh NAME PACKAGE==VERSION [PACKAGE ...]   # -> $cache/NAME/bin/python
#
# NAME should carry the pinned version, so that a new pin builds a new environment. The cache
# is $FLINT_PYTHON_DIR, else ${XDG_CACHE_HOME:-~/.cache}/flint/python.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 NAME PACKAGE==VERSION [PACKAGE ...]" >&2
  exit 2
fi
name=$1
shift
cache="${FLINT_PYTHON_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/python}"
dir="$cache/$name"
python="$dir/bin/python"
mkdir -p "$cache"

exec 9>"$dir.lock"
flock 9
if [ ! -f "$dir/.complete" ]; then
  system_python=$(command -v python3 || command -v python)
  if ! "$system_python" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "python-env: $system_python cannot make virtual environments; install python3-venv" >&2
    exit 1
  fi
  echo "python-env: installing $* from PyPI into $dir" >&2
  rm -rf "$dir"
  "$system_python" -m venv "$dir"
  "$python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$@"
  touch "$dir/.complete"
fi
echo "$python"
