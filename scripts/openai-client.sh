#!/usr/bin/env bash
# A Python virtual environment with the `openai` package from PyPI: the real OpenAI client that
# the `flint serve` tests drive the server with. Built once by scripts/python-env.sh; prints
# the path of its python interpreter.
#
#   scripts/openai-client.sh    # -> ~/.cache/flint/python/openai-3.57.0/bin/python
set -euo pipefail

version=3.57.0
exec bash "$(dirname "$0")/python-env.sh" "openai-$version" "openai==$version"
