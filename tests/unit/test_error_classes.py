"""Errors the product raises for values out of range (the router, tierd, the simulator, the
gateway's JSON codec) are in the exception tree (`contracts.errors`), and still the
ValueError their callers catch."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from contracts.errors import ConfigurationError, InputError, UpstreamError, WarmgateError
from contracts.tiers import Tier
from gateway.json_codec import decode
from gateway.launch.process import ProcessTree, wait_http
from gateway.launch.vllm_fleet import FleetConfig, VllmFleet
from gateway.pipeline.tokens import load_tokenizer
from gateway.upstream.transport import Target, check_header_values
from router.blocks import hash_blocks
from router.footprints import SessionFootprints
from router.index import PrefixIndex
from router.precise import VllmBlockHasher, Xxh3BlockHasher, cut_blocks
from sim.cluster.kvcache import L1Store, LruStore
from sim.engine.block_hash import BlockHasher
from sim.engine.kv_events import EnginePublisher
from sim.engine.prefix_cache import PrefixCache
from sim.players.encode import ChainIds
from sim.players.params import GameParams
from sim.traces import unshared_blocks
from tierd.connector.layout import layer_runs
from tierd.emulation import Emulator
from tierd.slices import make_meta
from tierd.tiers.l1_arena import L1Arena


@pytest.mark.parametrize(
    ("call", "phase"),
    [
        (lambda: PrefixIndex(ttl_s=0), ConfigurationError),
        (lambda: PrefixIndex(capacity_blocks=0), ConfigurationError),
        (lambda: PrefixIndex().insert("a", [1], Tier.HOST, predicted=True), InputError),
        (lambda: SessionFootprints(quantile=1.5), ConfigurationError),
        (lambda: SessionFootprints(max_sessions=0), ConfigurationError),
        (lambda: hash_blocks("text", seed=0, block_chars=0), ConfigurationError),
        (lambda: cut_blocks([1, 2], 0), ConfigurationError),
        (lambda: VllmBlockHasher(hash_seed="0", algo="sha1"), ConfigurationError),  # type: ignore[arg-type]
        (lambda: Xxh3BlockHasher(model="m", block_size=2).block_hashes([-1, 2]), InputError),
        (lambda: make_meta(1 << 64, b"x", None, None), InputError),
        (lambda: make_meta(1, b"x", -1, None), InputError),
        (lambda: make_meta(1, b"x", None, 1 << 32), InputError),
        (lambda: GameParams(players=0), ConfigurationError),
        (lambda: LruStore(-1, print), ConfigurationError),
        (lambda: L1Store(0, print), ConfigurationError),
        (lambda: ChainIds(0), ConfigurationError),
        (lambda: decode("[" * 100_000), InputError),
        (lambda: Target.parse("https://engine:9000"), ConfigurationError),
        (lambda: check_header_values({"x-a": "1\r\nx-b: 2"}), InputError),
        (lambda: load_tokenizer("no_colon"), ConfigurationError),
        (lambda: BlockHasher(16, "md5"), ConfigurationError),
        (lambda: BlockHasher(16, seed="0").block(None, [1, 2, 3]), InputError),
        (lambda: EnginePublisher("tcp://127.0.0.1:1", encoding="yaml"), ConfigurationError),
        (lambda: PrefixCache(8, 16), ConfigurationError),
        (lambda: Emulator("no-such-profile"), ConfigurationError),
        (lambda: Emulator(None, time_scale=0), ConfigurationError),
        (lambda: L1Arena(1024, 4096, backend="host"), ConfigurationError),
        (lambda: layer_runs([4, 8], [8, 1], 2, 0, num_blocks=3), ConfigurationError),
        (lambda: unshared_blocks([], 0), ConfigurationError),
    ],
)
def test_a_value_out_of_range_is_a_warmgate_error_and_a_value_error(
    call: Callable[[], object], phase: type[WarmgateError]
) -> None:
    with pytest.raises(phase) as info:
        call()
    assert isinstance(info.value, ValueError)


def test_a_supervised_child_that_fails_or_never_answers_is_an_upstream_error(
    tmp_path: Path,
) -> None:
    gone = ProcessTree.start("gone", [sys.executable, "-c", "pass"], tmp_path / "gone.log")
    try:
        with pytest.raises(UpstreamError) as info:
            wait_http(gone, "http://127.0.0.1:9/", timeout_s=30)
        assert isinstance(info.value, RuntimeError)
    finally:
        gone.stop(timeout_s=5)
    mute = ProcessTree.start(
        "mute", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "mute.log"
    )
    try:
        with pytest.raises(UpstreamError) as info:
            wait_http(mute, "http://127.0.0.1:9/", timeout_s=0.3)
        assert isinstance(info.value, TimeoutError)
    finally:
        mute.stop(timeout_s=5)


def test_a_fleet_vllm_cannot_start_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        VllmFleet(FleetConfig(model_dir=tmp_path, engines=0))
    assert isinstance(info.value, ValueError)
