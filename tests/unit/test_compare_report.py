"""The compare harness's parsing and report on records of a real run (real vLLM, real smg)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine_metrics import EngineDelta
from bench.replay import RequestRecord, instance_from_headers, predicted_from_headers
from bench.report import prediction_accuracy, render_markdown, summarize

DATA = Path(__file__).resolve().parents[1] / "data"


def _records(name: str) -> list[RequestRecord]:
    lines = (DATA / f"vllm-records-{name}.jsonl").read_text().splitlines()
    return [RequestRecord(**json.loads(line)) for line in lines]


def test_headers_name_the_instance_and_the_prediction() -> None:
    by_url = {"http://127.0.0.1:9001": "vllm-0"}
    assert instance_from_headers({"x-smg-routed-worker-id": "http://127.0.0.1:9001"}, by_url) == (
        "vllm-0"
    )
    assert predicted_from_headers({"x-warmgate-cached-tokens": "1536"}) == 1536
    assert predicted_from_headers({"x-warmgate-cached-tokens": "n/a"}) is None
    assert predicted_from_headers({}) is None


def test_accuracy_counts_exact_over_and_under() -> None:
    recs = _records("warmgate-ttft")
    acc = prediction_accuracy(recs)
    assert acc["prediction_requests"] == sum(1 for r in recs if r.ok)
    exact = sum(r.predicted_cached_tokens == r.cached_tokens for r in recs if r.ok)
    assert acc["prediction_exact_share"] == round(exact / acc["prediction_requests"], 4)
    # one prediction off by a block on each side: the figure moves and says which way
    recs[3].predicted_cached_tokens = (recs[3].cached_tokens or 0) + 128
    recs[4].predicted_cached_tokens = (recs[4].cached_tokens or 0) - 128
    off = prediction_accuracy(recs)
    assert (off["prediction_over"], off["prediction_under"]) == (1, 1)
    assert off["prediction_requests"] - round(
        off["prediction_exact_share"] * off["prediction_requests"]
    ) == 2 + (acc["prediction_requests"] - exact)
    assert off["prediction_mean_abs_error_tokens"] > acc["prediction_mean_abs_error_tokens"]
    assert prediction_accuracy(_records("smg"))["prediction_exact_share"] is None


def test_report_of_a_real_run() -> None:
    gateways = {name: summarize(_records(name), None) for name in ("warmgate-ttft", "smg")}
    ours, smg = gateways["warmgate-ttft"], gateways["smg"]
    assert ours["errors"] == 0 and ours["requests"] == 15
    cached = sum(r.cached_tokens or 0 for r in _records("smg"))
    prompt = sum(r.prompt_tokens for r in _records("smg"))
    assert smg["cached_token_ratio"] == round(cached / prompt, 4)
    assert smg["instance_source"] == "headers"  # from x-smg-routed-worker-id
    assert "x-smg-routed-worker-id" in smg["gateway_headers"]
    assert ours["ttft_p50_s"] is not None and ours["ttft_p50_s"] <= ours["ttft_p99_s"]
    gateways["dynamo"] = {"skipped": "dynamo.vllm does not import"}
    md = render_markdown(
        {
            "name": "t",
            "config": {"engines": "vllm", "instances": 2, "seed": 11},
            "gateways": gateways,
        }
    )
    assert "real vLLM engines" in md and "Seed 11" in md
    assert "## Precise accuracy" in md
    assert (
        "| smg | exposes no prediction (x- headers: `x-request-id`, `x-smg-routed-worker-id`)" in md
    )
    assert "| dynamo | skipped: dynamo.vllm does not import |" in md


def test_the_overflow_scale_brings_its_defaults_and_flags_win() -> None:
    from bench.compare import parse_args

    args = parse_args(["--engines", "vllm", "--workload", "game", "--scale", "cpu-overflow"])
    assert (args.players, args.engine_kv_blocks, args.minutes) == (20, 48, 1.5)
    args = parse_args(
        ["--engines", "vllm", "--workload", "game", "--scale", "cpu-overflow", "--players", "9"]
    )
    assert (args.players, args.engine_kv_blocks) == (9, 48)
    assert parse_args(["--engines", "vllm", "--workload", "game"]).engine_kv_blocks is None


def test_the_report_shows_tierd_and_the_prefetch_on_time_share() -> None:
    summary = summarize(_records("warmgate-ttft"), {})
    tiers = {
        "prefetch_on_time_share": 0.875, "prefetch_on_time": 7, "prefetch_late": 1,
        "tierd_loaded_tokens": 1280, "tierd_load_failed_blocks": 0, "tierd_saved_blocks": 40,
        "save_ms_per_block": 2.1, "save_wait_ms_per_block": 0.4,
        "lookup_rtt_p50_us_worst_engine": 210,
    }  # fmt: skip
    md = render_markdown({"name": "t", "gateways": {"warmgate-ttft": {**summary, **tiers}}})
    assert "## tierd" in md and "**87.5%**" in md and "| 8 | 1280 |" in md
    assert "## tierd" not in render_markdown({"name": "t", "gateways": {"smg": summary}})


def test_time_outside_the_engines_is_measured_to_the_first_token_of_every_answer() -> None:
    # the engines counted a first token for all three answers; the client's first text came
    # two decode steps later on one, and never on another (its tokens printed nothing)
    def record(i: int, first: float, text: float | None) -> RequestRecord:
        r = RequestRecord(index=i, scheduled_s=0.0, sent=True, status=200, ok=text is not None)
        r.first_token_s, r.ttft_s = first, text
        return r

    records = [record(0, 0.11, 0.11), record(1, 0.21, 0.31), record(2, 0.14, None)]
    engines = {"e0": EngineDelta(requests=3, ttft_sum=0.30, ttft_count=3)}
    summary = summarize(records, engines)
    assert summary["errors"] == 1  # the answer with no text
    assert summary["ttft_mean_s"] == pytest.approx(0.21)  # first text, answers with text
    assert summary["first_token_mean_s"] == pytest.approx(0.46 / 3, abs=1e-4)  # rounded
    assert summary["outside_engine_ttft_mean_s"] == pytest.approx(0.46 / 3 - 0.10, abs=1e-4)
