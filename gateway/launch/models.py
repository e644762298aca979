"""The small local model real engines serve, built once and cached (never downloaded).

- `engine_python()` -> the engine venv's interpreter: $WARMGATE_ENGINE_PYTHON, else
  $ENGINE_VENV/bin/python, else `.venv-vllm/bin/python` in this checkout (what
  `bash scripts/install-engine.sh` creates).
- `model_cache_dir()` -> $WARMGATE_MODEL_CACHE, else ~/.cache/warmgate/models.
- `ensure_tiny_model(python=..., seed=0)` -> the model's directory, building it with
  `tiny_model_build.py` under the engine's python if it is not there yet. A file lock makes
  concurrent callers (two test sessions, `up` and a test) build it once; the build goes to a
  temporary directory renamed into place, so a half-written model is never seen.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from contracts.errors import ConfigurationError
from gateway.launch import tiny_model_build as recipe

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = Path(recipe.__file__).resolve()
TINY_MODEL = "warmgate-tiny-qwen2"
INSTALL_HINT = "bash scripts/install-engine.sh"


class EngineEnvMissing(ConfigurationError, RuntimeError):
    """The engine's virtual environment is not installed."""


class ModelBuildError(ConfigurationError, RuntimeError):
    """The tiny test model could not be built in the engine's environment."""


def engine_python() -> Path:
    """The interpreter of the engine's own virtual environment (it may not exist)."""
    explicit = os.environ.get("WARMGATE_ENGINE_PYTHON")
    if explicit:
        return Path(explicit)
    venv = os.environ.get("ENGINE_VENV")
    base = Path(venv) if venv else REPO_ROOT / ".venv-vllm"
    return base / "bin" / "python"


def require_engine_python(python: Path | None = None) -> Path:
    """`python` (default `engine_python()`) if it can import vllm; else EngineEnvMissing."""
    py = python or engine_python()
    if not py.exists():
        raise EngineEnvMissing(f"no engine environment at {py}: install it with `{INSTALL_HINT}`")
    probe = subprocess.run(
        [
            str(py),
            "-c",
            # is vllm on its path (without importing it: that takes seconds)
            "import pkgutil as p; "
            "raise SystemExit('vllm' not in {m.name for m in p.iter_modules()})",
        ],
        capture_output=True,
        timeout=60,
    )
    if probe.returncode != 0:
        raise EngineEnvMissing(f"{py} cannot import vllm: install it with `{INSTALL_HINT}`")
    return py


def model_cache_dir() -> Path:
    env = os.environ.get("WARMGATE_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "warmgate" / "models"


def _complete(path: Path, seed: int, fmt: int = recipe.FORMAT) -> bool:
    try:
        manifest = json.loads((path / "warmgate-model.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(
        manifest.get("format") == fmt
        and manifest.get("seed") == seed
        and (path / "model.safetensors").exists()
        and (path / "tokenizer.json").exists()
    )


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _upgrade_format_1(path: Path) -> None:
    """Format 1 -> 2 in place: Qwen2's tokenization rules into tokenizer.json (the engines
    already tokenized by them under transformers 5, so running engines see no change), then
    the manifest. Replaced file by file, so a reader sees the old file or the new one."""
    tok = path / "tokenizer.json"
    upgraded = recipe.qwen2_rules(json.loads(tok.read_text()))
    _write_atomically(tok, json.dumps(upgraded, ensure_ascii=False))
    manifest = json.loads((path / "warmgate-model.json").read_text())
    manifest["format"] = recipe.FORMAT
    _write_atomically(path / "warmgate-model.json", json.dumps(manifest, indent=2) + "\n")


def ensure_tiny_model(
    *, python: Path | None = None, seed: int = 0, cache_dir: Path | None = None
) -> Path:
    """The tiny Qwen2's directory, built on first use (about 5-60 s) and reused after."""
    root = cache_dir or model_cache_dir()
    name = TINY_MODEL if seed == 0 else f"{TINY_MODEL}-seed{seed}"
    target = root / name
    if _complete(target, seed):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the build is in place
        if _complete(target, seed):
            return target
        if _complete(target, seed, fmt=1):
            _upgrade_format_1(target)
            return target
        py = require_engine_python(python)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            result = subprocess.run(
                [str(py), str(BUILD_SCRIPT), str(tmp), "--seed", str(seed)],
                capture_output=True,
                text=True,
                env=env,
                timeout=900,
            )
            if result.returncode != 0:
                raise ModelBuildError(
                    f"building {name} failed ({result.returncode}):\n{result.stderr[-3000:]}"
                )
            if target.exists():
                shutil.rmtree(target)  # an incomplete or older-format build
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
