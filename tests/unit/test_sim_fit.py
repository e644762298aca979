"""sim.fit: the profile fit of `bench simfit` recovers known physics and refuses bad input;
the fitted profile's JSON round trip; bench.simfit_trace's block ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.simfit_trace import TokenBlockIds, token_trace
from contracts.errors import InputError
from router.errors import BlockSizeError
from sim import profiles
from sim.cluster.probe import probe_ttft
from sim.fit import (
    DecodeSample,
    FitInputError,
    PrefillSample,
    fit_decode,
    fit_prefill,
    nonnegative_least_squares,
    predicted_prefill_s,
    prefill_features,
    slowdown,
)
from sim.profiles import PROFILES, Profile, get_profile, profile_from_json, profile_to_json

TRUE = Profile(
    name="t",
    source="test",
    kv_bytes_per_token=1,
    prefill_overhead_s=0.05,
    prefill_per_token_s=9e-4,
    prefill_attention_s=2e-7,
    step_base_s=0.02,
    step_per_seq_s=0.001,
    step_per_kv_token_s=1e-6,
    kv_capacity_tokens=6144,
    max_batch_tokens=2048,
)


def test_features_cut_a_prompt_into_the_engines_chunks() -> None:
    # 5000 cold tokens in chunks of 2048: 3 steps; pairs = sum chunk * (ctx + chunk / 2)
    steps, tokens, pairs = prefill_features(5000, 0, 2048)
    assert (steps, tokens) == (3.0, 5000.0)
    assert pairs == 2048 * 1024 + 2048 * (2048 + 1024) + 904 * (4096 + 452)
    # a fully cached prompt still computes its last token
    assert prefill_features(0, 1000, 2048) == (1.0, 1.0, 1000.5)


def test_the_prefill_fit_recovers_the_physics_the_simulator_charges() -> None:
    # samples as the simulator's own probe times them: the fit must give the profile back
    samples = [PrefillSample(n, 0, probe_ttft(TRUE, n)) for n in (128, 512, 1024, 2500, 4096, 5800)]
    samples += [PrefillSample(900, c, TRUE.prefill_seconds(900, c)) for c in (1152, 3000)]
    fit = fit_prefill(samples, 2048)
    got = fit.coefficients
    assert got[0] == pytest.approx(0.05, rel=1e-6)
    assert got[1] == pytest.approx(9e-4, rel=1e-6)
    assert got[2] == pytest.approx(2e-7, rel=1e-6)
    assert fit.rms_relative_error < 1e-9
    assert predicted_prefill_s(fit, 4096, 0, 2048) == pytest.approx(probe_ttft(TRUE, 4096))


def test_the_fit_never_returns_a_negative_figure() -> None:
    # times that fall with size want a negative slope: the best non-negative fit drops it
    rows = [(1.0, 100.0), (1.0, 200.0), (1.0, 300.0)]
    fit = nonnegative_least_squares(rows, [3.0, 2.0, 1.0])
    assert all(c >= 0 for c in fit.coefficients)
    assert fit.coefficients[1] == 0.0


def test_the_decode_fit_recovers_its_step() -> None:
    samples = [
        DecodeSample(b, kv, TRUE.decode_step_seconds(b, kv))
        for b, kv in ((1, 400), (2, 900), (4, 1700), (8, 6000))
    ]
    base, per_seq, per_kv = fit_decode(samples).coefficients
    assert (base, per_seq, per_kv) == pytest.approx((0.02, 0.001, 1e-6), rel=1e-6)


def test_bad_samples_are_refused_from_the_exception_tree() -> None:
    with pytest.raises(FitInputError):
        fit_prefill([PrefillSample(100, 0, 0.1)], 2048)
    with pytest.raises(FitInputError):
        nonnegative_least_squares([(1.0,), (2.0,)], [1.0, 0.0])
    with pytest.raises(FitInputError):
        prefill_features(100, 0, 0)
    with pytest.raises(FitInputError):
        slowdown([], [])
    assert issubclass(FitInputError, InputError)


def test_slowdown_is_the_median_ratio() -> None:
    assert slowdown([2.0, 3.0, 10.0], [1.0, 1.0, 1.0]) == 3.0
    assert slowdown([2.0, 4.0], [1.0, 1.0]) == 3.0


def test_a_profile_survives_json_and_a_fitted_file_is_found_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = PROFILES["llama3-8b-h100"]
    assert profile_from_json(json.loads(json.dumps(profile_to_json(p)))) == p
    monkeypatch.setattr(profiles, "FITTED_DIR", tmp_path)
    (tmp_path / "mine.json").write_text(json.dumps(profile_to_json(TRUE)))
    assert get_profile("mine") == TRUE
    with pytest.raises(profiles.UnknownProfileError, match="mine"):
        get_profile("nobody")
    with pytest.raises(profiles.ProfileFileError):
        profile_from_json({"name": "x"})


def test_block_ids_share_only_full_blocks_of_equal_prefixes() -> None:
    ids = TokenBlockIds(4)
    a = ids.ids([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = ids.ids([1, 2, 3, 4, 5, 6, 7, 8, 9])  # the same prompt: full blocks shared
    c = ids.ids([1, 2, 3, 4, 0, 6, 7, 8])  # same first block, then different
    assert a[:2] == b[:2] and a[2] != b[2]  # the partial last block is never shared
    assert c[0] == a[0] and c[1] != a[1]
    assert len(set(a + b + c)) == 5  # 0, 1 shared; two partial blocks; c's second
    with pytest.raises(BlockSizeError):
        TokenBlockIds(0)
    trace = token_trace([(0.5, [1, 2, 3, 4, 5], 8, "s")], 4)
    assert trace[0].input_length == 5 and len(trace[0].hash_ids) == 2
    assert trace[0].timestamp_ms == 500.0 and trace[0].session == "s"


def test_the_busy_factor_is_found_by_bisection_and_clamped_to_its_range() -> None:
    from bench.simfit_calibrate import bisect_increasing

    assert bisect_increasing(lambda x: x * x, 4.0, 1.0, 4.0) == pytest.approx(2.0, abs=1e-6)
    assert bisect_increasing(lambda x: x, 0.5, 1.0, 4.0) == 1.0  # below the range
    assert bisect_increasing(lambda x: x, 9.0, 1.0, 4.0) == 4.0  # beyond it
    with pytest.raises(FitInputError):
        bisect_increasing(lambda x: x, 1.0, 2.0, 2.0)
