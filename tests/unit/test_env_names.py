"""`WARMGATE_*` environment variables: one that names no setting is refused, naming the
closest valid name (the gateway's settings and tierd's, `contracts.settings_sources`);
the names other parts read are on one list (`gateway.config.env_names`), which covers
every such name in the repository."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts.errors import ConfigurationError
from contracts.settings_sources import unknown_env
from gateway.config.env_names import OTHER_NAMES, OTHER_PREFIXES
from gateway.config.settings import ENV_PREFIX, Settings, load_settings
from tierd.settings import ENV_PREFIX as TIERD_PREFIX
from tierd.settings import TierdSettings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_warmgate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("WARMGATE_"):
            monkeypatch.delenv(name)


def test_a_misspelt_top_level_variable_is_refused_with_the_closest_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMGATE_HELTH__INTERVAL_S", "1")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    message = str(info.value)
    assert "WARMGATE_HELTH__INTERVAL_S" in message
    assert "did you mean WARMGATE_HEALTH__INTERVAL_S?" in message
    assert isinstance(info.value, ValueError)  # `warmgate serve` reports it as bad config
    monkeypatch.delenv("WARMGATE_HELTH__INTERVAL_S")
    monkeypatch.setenv("WARMGATE_PROT", "9000")
    with pytest.raises(ConfigurationError, match=r"WARMGATE_PROT \(did you mean WARMGATE_PORT\?\)"):
        load_settings()


def test_settings_and_names_other_parts_read_are_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WARMGATE_HEALTH__INTERVAL_S", "0.25")
    monkeypatch.setenv("WARMGATE_PORT", "9001")
    monkeypatch.setenv("WARMGATE_NATIVE", "python")  # the native modules'
    monkeypatch.setenv("WARMGATE_UP_START_TIMEOUT", "5")  # `warmgate up`'s flag twin
    monkeypatch.setenv("WARMGATE_TIERD__L1_BYTES", "4096")  # tierd's own settings
    monkeypatch.setenv("WARMGATE_ENGINE__TIME_SCALE", "0.01")  # the simulated engine's
    s = load_settings()
    assert (s.health.interval_s, s.port) == (0.25, 9001)
    # a nested key stays the nested model's to refuse
    monkeypatch.setenv("WARMGATE_HEALTH__HELTH", "1")
    with pytest.raises(ValidationError, match=r"health\.helth"):
        load_settings()


def _names_read_in_the_repository() -> set[str]:
    """Every `WARMGATE_*` name a Python file quotes (what `os.environ` is asked for), and
    every one the deployment files use; this file's deliberate misspellings aside."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    names: set[str] = set()
    quoted = re.compile(r"""["'](WARMGATE_[A-Z0-9_]+)["'{]""")
    bare = re.compile(r"\b(WARMGATE_[A-Z0-9_]+)")
    for rel in tracked:
        path = REPO / rel
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        if rel.endswith(".py"):
            names |= set(quoted.findall(path.read_text(errors="replace")))
        elif rel.startswith("deploy/"):
            names |= set(bare.findall(path.read_text(errors="replace")))
    return names


def test_every_warmgate_variable_the_repository_reads_is_a_setting_or_listed() -> None:
    names = _names_read_in_the_repository()
    assert "WARMGATE_NATIVE" in names and "WARMGATE_PORT" in names  # the scan sees them
    variables = {}
    for name in names:
        if name.endswith("__"):  # a prefix of flag twins, e.g. "WARMGATE_ENGINE__"
            rest = name.removeprefix(ENV_PREFIX)
            assert rest in OTHER_PREFIXES or rest[:-2].lower() in Settings.model_fields, name
        else:
            variables[name] = ""
    unknown = unknown_env(
        Settings,
        prefix=ENV_PREFIX,
        nested_delimiter="__",
        allowed=OTHER_NAMES,
        allowed_prefixes=OTHER_PREFIXES,
        environ=variables,
    )
    assert unknown == []
    tierd = {n: "" for n in variables if n.startswith(TIERD_PREFIX)}
    assert unknown_env(TierdSettings, prefix=TIERD_PREFIX, environ=tierd) == []


def test_tierd_refuses_a_misspelt_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMGATE_TIERD__L1_BYTEZ", "4096")
    with pytest.raises(ConfigurationError) as info:
        TierdSettings()
    assert "WARMGATE_TIERD__L1_BYTEZ (did you mean WARMGATE_TIERD__L1_BYTES?)" in str(info.value)
    monkeypatch.delenv("WARMGATE_TIERD__L1_BYTEZ")
    monkeypatch.setenv("WARMGATE_TIERD__L1_BYTES", "4096")
    monkeypatch.setenv("WARMGATE_HEALTH__INTERVAL_S", "1")  # the gateway's: not tierd's to check
    assert TierdSettings().l1_bytes == 4096


def test_tierd_refuses_unknown_keys_and_reads_yaml_below_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        TierdSettings(l1_bytez=4096)  # type: ignore[call-arg]
    bad = tmp_path / "bad.yaml"
    bad.write_text("pool: p\nsesion_ttl_s: 3\n")
    with pytest.raises(ValidationError, match="sesion_ttl_s"):
        TierdSettings(config_file=bad)
    cfg = tmp_path / "tierd.yaml"
    cfg.write_text("pool: yaml\nport: 1234\nslice-bytes: 8192\nl1_bytes: 65536\n")
    monkeypatch.setenv("WARMGATE_TIERD__POOL", "env")
    monkeypatch.setenv("WARMGATE_TIERD__PORT", "4321")
    s = TierdSettings(config_file=cfg, port=5)
    assert (s.port, s.pool, s.slice_bytes, s.l1_bytes) == (5, "env", 8192, 65536)
    with pytest.raises(ConfigurationError, match="not found"):
        TierdSettings(config_file=tmp_path / "missing.yaml")


def test_tierd_serve_reports_it_as_bad_configuration(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tierd.serve import main

    monkeypatch.setenv("WARMGATE_TIERD__POOOL", "x")
    assert main(["--port", "0"]) == 2
    assert "bad configuration" in capsys.readouterr().err
