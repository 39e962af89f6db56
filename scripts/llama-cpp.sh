#!/usr/bin/env bash
# A Python virtual environment with llama-cpp-python from PyPI, which builds llama.cpp from
# source for this machine's CPU (a few minutes on two cores): the engine that
# scripts/compare-llama-cpp.sh measures flint against. Built once by scripts/python-env.sh;
# prints the path of its python interpreter.
#
#   scripts/llama-cpp.sh    # -> ~/.cache/flint/python/llama-cpp-0.3.36/bin/python
set -euo pipefail

# The version that made tests/reference (its README names it).
version=0.3.36
if ! command -v c++ >/dev/null; then
  echo "llama-cpp: building llama.cpp needs a C++ compiler; install g++" >&2
  exit 1
fi
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  exec bash "$(dirname "$0")/python-env.sh" "llama-cpp-$version" "llama-cpp-python==$version" numpy
