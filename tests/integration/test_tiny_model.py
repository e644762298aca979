"""The local model real engines serve: built without a network, the same bytes for a seed."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from gateway.launch.models import ensure_tiny_model
from tests.support.engines import engine_python_or_skip

pytestmark = pytest.mark.engines  # its engine python runs in the real engines' worker


def _digests(path: Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.iterdir())
        if f.is_file()
    }


def test_build_is_deterministic_and_loadable(tmp_path: Path) -> None:
    py = engine_python_or_skip()
    cached = ensure_tiny_model(python=py)
    fresh = ensure_tiny_model(python=py, cache_dir=tmp_path)
    assert fresh != cached
    assert _digests(fresh) == _digests(cached)
    manifest = json.loads((fresh / "warmgate-model.json").read_text())
    assert manifest["parameters"] == 40_912_128  # the 40.9M-parameter Qwen2 of REAL_ENGINES.md
    assert ensure_tiny_model(python=py, cache_dir=tmp_path) == fresh  # cached: not rebuilt
    probe = (
        "import sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "s = t.apply_chat_template([{'role': 'user', 'content': 'Hello'}], tokenize=False, "
        "add_generation_prompt=True); print(s); print(len(t)); print(t.decode(t(s)['input_ids']))"
    )
    out = subprocess.run(
        [str(py), "-c", probe, str(fresh)],
        capture_output=True,
        text=True,
        check=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
        timeout=120,
    ).stdout
    chat = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    assert out == f"{chat}\n4096\n{chat}\n"
