"""The real-engine benches' `--max-num-batched-tokens` and `--long-prefill-token-threshold`
(bench.real_fleet.add_step_option): a positive token count becomes vLLM's flag, no value leaves
the engine's default, and anything else is refused at parse time rather than at engine start."""

from __future__ import annotations

import argparse

import pytest

from bench.real_fleet import add_step_option, step_engine_args


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench")
    add_step_option(p)
    return p


def test_a_step_becomes_the_engine_flag() -> None:
    args = _parser().parse_args(["--max-num-batched-tokens", "128"])
    assert step_engine_args(args) == ("--max-num-batched-tokens", "128")


def test_a_prefill_cap_becomes_the_engine_flag_beside_the_step() -> None:
    args = _parser().parse_args(
        ["--max-num-batched-tokens", "128", "--long-prefill-token-threshold", "64"]
    )
    assert step_engine_args(args) == (
        "--max-num-batched-tokens",
        "128",
        "--long-prefill-token-threshold",
        "64",
    )


def test_no_step_keeps_the_engine_default() -> None:
    assert step_engine_args(_parser().parse_args([])) == ()


@pytest.mark.parametrize("flag", ["--max-num-batched-tokens", "--long-prefill-token-threshold"])
@pytest.mark.parametrize("bad", ["0", "-64", "many", "1.5"])
def test_a_count_that_is_not_positive_is_a_usage_error(
    flag: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args([flag, bad])
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err
