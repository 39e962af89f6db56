#!/usr/bin/env bash
# A Python virtual environment with llama-cpp-python from PyPI, which builds llama.cpp from
# source for this machine's CPU (a few minutes on two cores): the engine that
# scripts/compare-llama-cpp.py measures flint against. It lives in a cache outside the
# repository, one folder per pinned version, and is built once (concurrent callers wait for
# each other). Prints the path of its python interpreter.
#
#   scripts/llama-cpp.sh    # -> ~/.cache/flint/python/llama-cpp-0.3.36/bin/python
#
# The cache is $FLINT_PYTHON_DIR, else ${XDG_CACHE_HOME:-~/.cache}/flint/python.
set -euo pipefail

# The version that made ../shared/reference (its README names it).
version=0.3.36
cache="${FLINT_PYTHON_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/python}"
dir="$cache/llama-cpp-$version"
python="$dir/bin/python"
mkdir -p "$cache"

exec 9>"$dir.lock"
flock 9
if [ ! -f "$dir/.complete" ]; then
  system_python=$(command -v python3 || command -v python)
  if ! "$system_python" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "llama-cpp: $system_python cannot make virtual environments; install python3-venv" >&2
    exit 1
  fi
  if ! command -v c++ >/dev/null; then
    echo "llama-cpp: building llama.cpp needs a C++ compiler; install g++" >&2
    exit 1
  fi
  echo "llama-cpp: building llama-cpp-python==$version from PyPI into $dir (minutes)" >&2
  rm -rf "$dir"
  "$system_python" -m venv "$dir"
  "$python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    "llama-cpp-python==$version" numpy
  touch "$dir/.complete"
fi
echo "$python"
