#!/usr/bin/env bash
# llama.cpp against its own reference data with only flash attention or the KV-cache precision
# changed: how tight a bound against tests/reference can be (scripts/reference_variance.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(bash scripts/llama-cpp.sh)
exec "$python" scripts/reference_variance.py "$@"
