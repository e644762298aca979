"""The tiny model's tokenizer.json carries Qwen2's tokenization rules (recipe format 2), so
the gateway's local tokenizer, which reads the file, splits text as the engine does: under
transformers 5 vLLM builds a Qwen2 tokenizer with Qwen2's own pre-tokenizer whatever the
file says. With format 1's byte-level split the gateway made one token of " 1" where the
engine made two, and every block hash after it differed (prefetch hints named no block the
engine had). A cached format-1 build is upgraded in place, vocabulary unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from gateway.launch import tiny_model_build as recipe
from gateway.launch.models import TINY_MODEL, ensure_tiny_model
from tests.support.hf_tokenizer_dir import build


def _format_1_build(root: Path) -> Path:
    """A cached build as format 1 left it: a byte-level tokenizer.json and its manifest."""
    target = build(root / TINY_MODEL)
    (target / "model.safetensors").write_bytes(b"weights are not read here")
    manifest = {"format": 1, "seed": 0, "specials": recipe.SPECIALS}
    (target / "warmgate-model.json").write_text(json.dumps(manifest))
    return target


def _pieces(path: Path, text: str) -> list[str]:
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    pre = tok.pre_tokenizer
    assert pre is not None
    norm = tok.normalizer
    return [p for p, _ in pre.pre_tokenize_str(norm.normalize_str(text) if norm else text)]


def test_a_format_1_build_gets_qwen2s_split_in_place(tmp_path: Path) -> None:
    target = _format_1_build(tmp_path)
    vocab_before = json.loads((target / "tokenizer.json").read_text())["model"]["vocab"]
    assert ensure_tiny_model(cache_dir=tmp_path) == target  # no rebuild: no engine needed
    # Qwen2's rule: a digit is a piece of its own, the space before it another
    assert _pieces(target, "zone 12.") == ["zone", "Ġ", "1", "2", "."]
    upgraded = json.loads((target / "tokenizer.json").read_text())
    assert upgraded["model"]["vocab"] == vocab_before
    assert upgraded["normalizer"] == {"type": "NFC"}
    manifest = json.loads((target / "warmgate-model.json").read_text())
    assert manifest["format"] == recipe.FORMAT == 2
    assert ensure_tiny_model(cache_dir=tmp_path) == target  # and it stays as it is


def test_qwen2_rules_are_transformers_qwen2_rules() -> None:
    """The regex as transformers' tokenization_qwen2.PRETOKENIZE_REGEX spells it."""
    spelled = (
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
        r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
    )
    assert spelled == recipe.QWEN2_SPLIT
    rules = recipe.qwen2_rules({"model": {"vocab": {}}})
    assert rules["pre_tokenizer"] == recipe.QWEN2_PRE_TOKENIZER
    assert rules["model"] == {"vocab": {}}
