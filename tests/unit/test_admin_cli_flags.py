"""`warmgate admin`'s global flags work before and after the subcommand (issue 20: `warmgate
admin instances --json` was refused), and one given after wins over one given before."""

from __future__ import annotations

import pytest

from gateway.admin.cli import _parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "--url", "http://gw:1", "--timeout", "3", "--admin-key", "k", "instances"],
        ["instances", "--json", "--url", "http://gw:1", "--timeout", "3", "--admin-key", "k"],
        ["--url", "http://gw:1", "--admin-key", "k", "instances", "--timeout", "3", "--json"],
    ],
)
def test_global_flags_on_either_side_of_the_subcommand(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert (args.command, args.json, args.gateway, args.timeout, args.admin_key) == (
        "instances", True, "http://gw:1", 3.0, "k",
    )  # fmt: skip


def test_defaults_hold_and_the_later_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARMGATE_URL", raising=False)
    monkeypatch.delenv("WARMGATE_ADMIN_KEY", raising=False)
    args = _parser().parse_args(["drain", "e1", "--wait"])
    assert (args.json, args.gateway, args.timeout, args.admin_key, args.wait) == (
        False, "http://127.0.0.1:8000", 30.0, None, True,
    )  # fmt: skip
    args = _parser().parse_args(["--url", "http://a:1", "stats", "--url", "http://b:2"])
    assert args.gateway == "http://b:2"


def test_an_unknown_flag_after_the_subcommand_is_still_an_error() -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["instances", "--jsn"])
    assert exc.value.code == 2
