#!/usr/bin/env bash
# One command for a session lent a GPU: tierd's native GPU backend (build + batched copies,
# tierd.native.device_check) and the KV connector's block copies between device KV tensors
# and tierd's shared arena in every vLLM layout (tierd.connector.device_check). Needs a
# python with torch built for the device (ENGINE_PYTHON, default .venv-vllm/bin/python)
# and warmgate's (.venv, for tierd). Prints two JSON lines; exits non-zero if either fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE_PYTHON=${ENGINE_PYTHON:-.venv-vllm/bin/python}
TIERD_PYTHON=${TIERD_PYTHON:-.venv/bin/python}
rc=0
python3 -m tierd.native.device_check --build || rc=1
PYTHONPATH=$PWD "$ENGINE_PYTHON" -m tierd.connector.device_check --tierd-python "$TIERD_PYTHON" || rc=1
exit $rc
