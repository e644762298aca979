"""The real-engine benches' `--max-num-batched-tokens` (bench.real_fleet.add_step_option): a
positive token count becomes vLLM's flag, no value leaves the engine's default, and anything
else is refused at parse time rather than at engine start."""

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
    assert step_engine_args(args.max_num_batched_tokens) == ("--max-num-batched-tokens", "128")


def test_no_step_keeps_the_engine_default() -> None:
    assert step_engine_args(_parser().parse_args([]).max_num_batched_tokens) == ()


@pytest.mark.parametrize("bad", ["0", "-64", "many", "1.5"])
def test_a_step_that_is_not_a_positive_count_is_a_usage_error(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["--max-num-batched-tokens", bad])
    assert exit_.value.code == 2
    assert "--max-num-batched-tokens" in capsys.readouterr().err
