"""`bench compare --gateway-env`: a setting of one of warmgate's gateways, and variants
(`warmgate-ttft@label`) that run a gateway twice in one comparison with different settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare_args import gateway_env, parse_args, source_trees
from bench.peers import REPO, base_gateway, peer_missing
from gateway.launch.process import ChildFailedError
from gateway.launch.tiered import TierdProcess


def test_a_variant_runs_its_base_under_its_own_name() -> None:
    assert base_gateway("warmgate-ttft@off") == "warmgate-ttft"
    assert base_gateway("warmgate-ttft") == "warmgate-ttft"
    assert peer_missing("warmgate-ttft-bare@x") is None
    missing = peer_missing("smg@x")
    assert missing is not None and "only warmgate's gateways have variants" in missing


def test_settings_are_collected_per_gateway() -> None:
    env = gateway_env(
        [
            "warmgate-ttft@off:WARMGATE_ROUTING__PRECISE__SEGMENT_CACHE_TOKENS=0",
            "warmgate-ttft@off:WARMGATE_GC__YOUNG=700",
            "warmgate-ttft:WARMGATE_LOG_LEVEL=a=b",
        ],
        ["warmgate-ttft", "warmgate-ttft@off", "smg"],
    )
    assert env == {
        "warmgate-ttft@off": {
            "WARMGATE_ROUTING__PRECISE__SEGMENT_CACHE_TOKENS": "0",
            "WARMGATE_GC__YOUNG": "700",
        },
        "warmgate-ttft": {"WARMGATE_LOG_LEVEL": "a=b"},
    }


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("warmgate-ttft:GC__YOUNG=1", "not NAME:WARMGATE_KEY=VALUE"),
        ("warmgate-ttft:WARMGATE_GC__YOUNG", "not NAME:WARMGATE_KEY=VALUE"),
        ("warmgate-ttft@other:WARMGATE_GC__YOUNG=1", "is not in --gateways"),
        ("smg:WARMGATE_GC__YOUNG=1", "is not one of warmgate's"),
    ],
)
def test_bad_entries_are_refused_with_the_reason(entry: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        gateway_env([entry], ["warmgate-ttft", "smg"])


def test_the_command_line_refuses_a_bad_entry(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--workload", "game", "--gateway-env", "nope"])
    assert "not NAME:WARMGATE_KEY=VALUE" in capsys.readouterr().err
    args = parse_args(
        ["--workload", "game", "--gateways", "warmgate-ttft,warmgate-ttft@x",
         "--gateway-env", "warmgate-ttft@x:WARMGATE_GC__YOUNG=5"]
    )  # fmt: skip
    assert args.gateway_env == {"warmgate-ttft@x": {"WARMGATE_GC__YOUNG": "5"}}


def test_a_tree_runs_a_variant_from_another_checkout(tmp_path: Path) -> None:
    """`--tree NAME=DIR`: the variant's process imports warmgate from DIR, even started
    from this checkout (as bench compare starts it: `python -m gateway.cli` here)."""
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "__init__.py").write_text("")
    (tmp_path / "gateway" / "cli.py").write_text("print(__file__)\n")
    args = parse_args(
        ["--workload", "game", "--gateways", "warmgate-ttft,warmgate-ttft@before",
         "--tree", f"warmgate-ttft@before={tmp_path}"]
    )  # fmt: skip
    env = args.gateway_env["warmgate-ttft@before"]
    assert "warmgate-ttft" not in args.gateway_env
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli"],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert run.stdout.strip() == str(tmp_path / "gateway" / "cli.py")
    assert args.source_trees == {"warmgate-ttft@before": tmp_path.resolve()}
    for bad, why in (
        (f"smg={tmp_path}", "is not one of warmgate's in --gateways"),
        ("warmgate-ttft@before", "not NAME=DIR"),
        (f"warmgate-ttft@before={tmp_path / 'nowhere'}", "holds no warmgate source tree"),
    ):
        with pytest.raises(ValueError, match=why):
            source_trees([bad], ["warmgate-ttft@before", "smg"], {})


def test_a_trees_tierd_runs_from_that_tree(tmp_path: Path) -> None:
    """Real engines with tiers: a variant's tierd (and connector) come from its tree too,
    or a before/after of tierd's code would compare this checkout's tierd with itself."""
    tree = tmp_path / "tree"
    (tree / "tierd").mkdir(parents=True)
    (tree / "tierd" / "__init__.py").write_text("")
    (tree / "tierd" / "cli.py").write_text("print('tierd from', __file__)\n")
    proc = TierdProcess("tierd-x", tmp_path, [sys.executable, "-m", "tierd.cli"], tree)
    try:
        with pytest.raises(ChildFailedError, match=f"tierd from {tree / 'tierd' / 'cli.py'}"):
            proc.start(timeout_s=10.0)
    finally:
        proc.stop()
