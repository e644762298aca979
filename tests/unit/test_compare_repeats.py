"""bench compare --repeats: rotation, medians, ratios to peers, ties, load flags, targets, the
merge of separate runs, and the tuned peers' command lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import compare_repeats as cr
from bench.compare import main as compare_main
from bench.compare import parse_args
from bench.peers import PEER_BINARIES, smg_command
from bench.report import render_markdown


def _row(p50: float, p90: float, p99: float, load: float = 2.0) -> dict[str, Any]:
    return {
        "ttft_p50_s": p50, "ttft_p90_s": p90, "ttft_p99_s": p99,
        "machine_load_mean": load, "requests": 100, "errors": 0,
    }  # fmt: skip


# three repeats: ours, smg (defaults) and smg-tuned
REPEATS: list[dict[str, Any]] = [
    {"warmgate-ttft": _row(0.3, 1.0, 2.0), "smg": _row(0.6, 2.0, 5.0),
     "smg-tuned": _row(0.4, 1.1, 2.1)},
    {"warmgate-ttft": _row(0.4, 1.2, 2.4), "smg": _row(0.9, 3.0, 6.0),
     "smg-tuned": _row(0.38, 1.3, 2.0)},
    {"warmgate-ttft": _row(0.2, 0.8, 3.0, load=6.0), "smg": _row(0.5, 2.5, 4.0),
     "smg-tuned": _row(0.5, 1.2, 2.6)},
]  # fmt: skip


def test_each_gateway_runs_first_once_over_as_many_repeats() -> None:
    names = ["a", "b", "c"]
    orders = [cr.rotated(names, k) for k in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert cr.rotated(names, 4) == ["b", "c", "a"]  # offsets wrap: separate runs 0, 1, 2, ...


def test_medians_and_the_median_ratio_to_each_peer_and_the_best_of_a_group() -> None:
    med = cr.median_rows(REPEATS)
    assert med["warmgate-ttft"]["ttft_p50_s"] == 0.3 and med["smg"]["ttft_p99_s"] == 5.0
    assert med["warmgate-ttft"]["repeats_ran"] == 3
    two = cr.median_rows(REPEATS[:2])["smg"]
    assert (two["requests"], two["ttft_p50_s"]) == (100, 0.75)
    assert isinstance(two["requests"], int)  # a count stays a count
    groups = cr.groups(list(med), ["warmgate-ttft"])
    assert groups == {"defaults": ["smg"], "tuned": ["smg-tuned"], "reference": []}
    ratios = cr.peer_ratios(REPEATS, ["warmgate-ttft"], groups)["warmgate-ttft"]
    # per repeat ours/smg at p50: 0.5, 0.444, 0.4 -> median 0.444 (not 0.3 / 0.6 = 0.5)
    assert ratios["smg"]["ttft_p50_s"] == 0.444
    assert ratios["best defaults"] == ratios["smg"]  # one peer in the group
    # at p99 against smg-tuned: 2/2.1, 2.4/2.0, 3/2.6 -> median 1.154
    assert ratios["best tuned"]["ttft_p99_s"] == 1.154


def test_the_best_of_a_group_is_its_lowest_peer_in_each_repeat() -> None:
    reps = [
        {"ours": _row(1.0, 1.0, 1.0), "p": _row(2.0, 2.0, 2.0), "q": _row(4.0, 4.0, 4.0)},
        {"ours": _row(1.0, 1.0, 1.0), "p": _row(4.0, 4.0, 4.0), "q": _row(2.0, 2.0, 2.0)},
    ]
    ratios = cr.peer_ratios(reps, ["ours"], {"defaults": ["p", "q"], "tuned": []})["ours"]
    assert ratios["best defaults"]["ttft_p50_s"] == 0.5  # 1/2 in both repeats
    assert ratios["p"]["ttft_p50_s"] == 0.375 and "best tuned" not in ratios


def test_a_spread_wider_than_the_gap_is_a_tie() -> None:
    med = cr.median_rows(REPEATS)
    verdicts = {
        (t["peer"], t["figure"]): t
        for t in cr.ties(REPEATS, med, ["warmgate-ttft"], ["smg", "smg-tuned"])
    }
    # p50 vs smg: gap 0.3, spreads 0.2 (ours) and 0.4 (smg) -> tie
    assert verdicts[("smg", "ttft_p50_s")]["tie"] is True
    # p99 vs smg: gap 2.6, spreads 1.0 and 2.0 -> ours ahead
    lead = verdicts[("smg", "ttft_p99_s")]
    assert (lead["tie"], lead["ahead"]) == (False, True)
    # p90 vs smg-tuned: gap 0.2, spreads 0.4 and 0.2 -> tie
    assert verdicts[("smg-tuned", "ttft_p90_s")]["tie"] is True


def test_a_run_whose_load_is_far_from_the_others_is_flagged() -> None:
    flags = cr.load_flags(REPEATS, margin=0.5)
    flagged = [(f["repeat"], f["gateway"]) for f in flags if f["flagged"]]
    assert flagged == [(2, "warmgate-ttft")]  # 6.0 against a median of 2.0: +200%
    assert len(flags) == 9
    assert not any(f["flagged"] for f in cr.load_flags(REPEATS, margin=2.5))


def test_targets_on_the_median_ratio_to_the_best_peer() -> None:
    out = cr.summarize_repeats(REPEATS, [list(r) for r in REPEATS], ["warmgate-ttft"])
    got = {(t["group"], t["figure"]): t["met"] for t in out["targets"]}
    assert got[("defaults", "ttft_p50_s")] is True  # 0.444 <= 0.5
    assert got[("defaults", "ttft_p90_s")] is True  # 0.4 <= 0.4: the bound is inclusive
    assert got[("tuned", "ttft_p90_s")] is False  # 0.909 > 0.8
    assert got[("tuned", "ttft_p99_s")] is False  # 1.154 > 0.8
    md = cr.repeats_markdown(out)
    assert "| warmgate-ttft | smg | p50 | 0.300 | 0.400 | tie |" in md
    assert "| 3 | warmgate-ttft | 6.000 | 2.000 | +200% | **flagged** |" in md
    assert "more than 50% off" in md


def _part(d: Path, k: int, rows: dict[str, Any], order: list[str]) -> str:
    d.mkdir()
    part = {
        "name": d.name, "started_at": f"2026-12-02T16:0{k}:00+00:00",
        "finished_at": f"2026-12-02T16:0{k}:50+00:00",
        "command": f"warmgate bench compare --rotate-offset {k}",
        "config": {"engines": "vllm", "workload": "game", "seed": 17, "instances": 2},
        "gateways": rows, "repeat_rows": [{g: rows[g] for g in order}],
        "repeated": {"orders": [order]}, "notes": [],
    }  # fmt: skip
    (d / "results.json").write_text(json.dumps(part))
    return str(d)


def test_separate_runs_merge_into_one_repeated_report(tmp_path: Path) -> None:
    groups = []
    for k, rows in enumerate(REPEATS):
        order = cr.rotated(list(rows), k)
        if k == 1:  # a run cut short after its first gateway, then the rest: one repeat
            cut = _part(tmp_path / "run-1a", k, {order[0]: rows[order[0]]}, order[:1])
            rest = {g: rows[g] for g in order[1:]}
            groups.append(cut + "+" + _part(tmp_path / "run-1b", k, rest, order[1:]))
            continue
        groups.append(_part(tmp_path / f"run-{k}", k, rows, order))
    out = tmp_path / "out"
    argv = ["--merge", ",".join(groups), "--name", "merged", "--results-dir", str(out)]
    assert compare_main(argv) == 0
    (result_dir,) = out.iterdir()
    merged = json.loads((result_dir / "results.json").read_text())
    assert merged["config"]["repeats"] == 3
    assert merged["repeated"]["orders"][1] == ["smg", "smg-tuned", "warmgate-ttft"]
    assert merged["gateways"]["smg"]["ttft_p90_s"] == 2.5  # the median row
    assert merged["repeated"]["ratios"]["warmgate-ttft"]["smg"]["ttft_p50_s"] == 0.444
    md = (result_dir / "report.md").read_text()
    assert "### Repeat 2 (order: smg → smg-tuned → warmgate-ttft)" in md
    assert "## Repeats, medians and ratios" in md
    # runs of another comparison do not merge
    first = tmp_path / "run-0" / "results.json"
    bad = json.loads(first.read_text())
    bad["config"]["seed"] = 11
    first.write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="seed"):
        compare_main(argv)


def test_one_repeat_reports_as_before() -> None:
    md = render_markdown({"name": "t", "gateways": REPEATS[0], "repeat_rows": [REPEATS[0]]})
    assert "## Repeats" not in md and "| smg-tuned | 0.400 |" in md


def test_the_repeat_flags() -> None:
    args = parse_args(["--engines", "vllm", "--workload", "game", "--repeats", "3"])
    assert (args.repeats, args.rotate_offset, args.load_margin) == (3, 0, 0.5)
    with pytest.raises(SystemExit):
        parse_args(["--workload", "game", "--repeats", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--engines", "vllm"])  # no workload and nothing to merge
    assert parse_args(["--merge", "a,b"]).merge == "a,b"


def test_tuned_peers_are_the_same_binaries_with_the_documented_thresholds() -> None:
    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    for peer in ("smg", "sglang-router"):
        plain = smg_command(peer, urls, 8000, 8001)
        tuned = smg_command(f"{peer}-tuned", urls, 8000, 8001)
        assert PEER_BINARIES[f"{peer}-tuned"] == PEER_BINARIES[peer]
        assert "--balance-abs-threshold" not in plain  # defaults: as installed
        assert tuned[: len(plain)] == plain
        extra = tuned[len(plain) :]
        assert extra == ["--balance-abs-threshold", "2", "--balance-rel-threshold", "1.5"]


def test_the_floor_is_a_reference_never_the_best_peer() -> None:
    """bench.proxy_floor beside the peers: its own group, whatever its figures."""
    names = ["warmgate-ttft", "smg", "floor", "smg-tuned"]
    assert cr.groups(names, ["warmgate-ttft"]) == {
        "defaults": ["smg"],
        "tuned": ["smg-tuned"],
        "reference": ["floor"],
    }
