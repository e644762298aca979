#!/usr/bin/env bash
# One command for a session lent a GPU:
#   1. tierd.native.device_check: builds the C extension and the GPU backend (nvcc / hipcc)
#      in place, then DeviceArena copy_batch H2D / D2H / D2D GB/s;
#   2. tierd.connector.device_check: the KV connector's block copies in every vLLM layout
#      (CPU, FlashAttention, FlashInfer, vLLM 0.32's NHD view) on real torch device tensors:
#      through a real tierd (native and torch paths, bit-exact round trips), and the native
#      BlockCopier's gather/scatter against torch's copies (bytes equal, bad input refused,
#      GB/s of each).
# Needs a python with torch built for the device (ENGINE_PYTHON, default .venv-vllm/bin/python;
# the native module is built for that same python) and warmgate's (TIERD_PYTHON, default
# .venv/bin/python, to start tierd). JSON reports go to $WG_DEVICE_OUT (default
# $OUT/tierd-device-check, else /tmp/tierd-device-check). Exits non-zero if either fails.
# BACKEND=hip for AMD.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE_PYTHON=${ENGINE_PYTHON:-.venv-vllm/bin/python}
TIERD_PYTHON=${TIERD_PYTHON:-.venv/bin/python}
BACKEND=${BACKEND:-cuda}
OUT_DIR=${WG_DEVICE_OUT:-${OUT:-/tmp}/tierd-device-check}
mkdir -p "$OUT_DIR"
if [ ! -x "$ENGINE_PYTHON" ]; then ENGINE_PYTHON=$(command -v python3); fi
if [ ! -x "$TIERD_PYTHON" ]; then TIERD_PYTHON=$ENGINE_PYTHON; fi
rc=0
"$ENGINE_PYTHON" -m tierd.native.device_check --build --backend "$BACKEND" \
  --json "$OUT_DIR/native.json" || rc=1
PYTHONPATH=$PWD "$ENGINE_PYTHON" -m tierd.connector.device_check \
  --tierd-python "$TIERD_PYTHON" --json "$OUT_DIR/connector.json" || rc=1
echo "reports: $OUT_DIR/native.json $OUT_DIR/connector.json (rc=$rc)" >&2
exit $rc
