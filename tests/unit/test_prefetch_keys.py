"""The prefetch hint names the slices tierd holds: in precise mode the engine's block hashes
(the keys tierd's vLLM connector stores under, `block_key` of vLLM's digests), by default;
approximate mode, or an explicit `tiers.hint_keys: approximate`, the character blocks."""

from __future__ import annotations

from typing import Any

from gateway.app import build_pipeline, build_state
from gateway.config.settings import Settings
from gateway.pipeline.parse import parse_chat, route_request
from gateway.pipeline.tokens import PreciseChains
from router.precise import VllmBlockHasher
from router.types import RouteRequest
from tierd.connector.plan import block_key

# vLLM's sha256_cbor digests of blocks [0..15], [16..31] with PYTHONHASHSEED=0 (PROTOCOLS §2,
# tests/unit/test_precise.py): what the engine hands its connector as `request.block_hashes`
VLLM_DIGESTS = [
    "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c",
    "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac",
]
CONNECTOR_KEYS = [block_key(bytes.fromhex(d)) for d in VLLM_DIGESTS]


def _settings(mode: str, **tiers: Any) -> Settings:
    return Settings(
        instances=[
            {
                "id": "a",
                "url": "http://127.0.0.1:9",
                "tierd_url": "http://127.0.0.1:8",
                "models": ["m"],
            }
        ],
        routing={"mode": mode, "precise": {"hash_seed": "0", "block_size": 16}},
        tiers=tiers,
    )


PARSED = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x" * 600}]}, None)


async def _hinted(settings: Settings, rr: RouteRequest | None = None) -> list[int]:
    """The chain the pipeline's prefetch plan names for `rr`, by default a precise route
    request of tokens 0..31 (as PreciseChains builds it from the engine's tokens)."""
    state = build_state(settings)
    try:
        if state.precise is None:  # approximate mode: the lifespan builds none either
            assert settings.routing.mode == "approximate"
        else:
            assert isinstance(state.precise, PreciseChains)
        pipeline = build_pipeline(state)
        if rr is None:
            hashes = VllmBlockHasher(hash_seed="0", block_size=16).block_hashes(list(range(32)))
            rr = RouteRequest("m", hashes, 16, 32)
        plan = pipeline._prefetch_plan(PARSED, rr, "a")
        assert plan is not None and plan.instance == "a"
        return list(plan.chain)
    finally:
        await state.client.aclose()
        for close in state.closers:
            await close()


async def test_precise_mode_hints_in_the_keys_the_connector_stores_by_default() -> None:
    assert await _hinted(_settings("precise")) == CONNECTOR_KEYS


async def test_an_explicit_setting_still_wins() -> None:
    settings = _settings("precise", hint_keys="approximate")
    approximate = list(route_request(PARSED, settings.routing).block_hashes)
    assert approximate and approximate != CONNECTOR_KEYS
    assert await _hinted(settings) == approximate
    assert await _hinted(_settings("precise", hint_keys="engine")) == CONNECTOR_KEYS


async def test_approximate_mode_hints_the_route_chain() -> None:
    settings = _settings("approximate")
    rr = route_request(PARSED, settings.routing)
    assert rr.block_hashes and await _hinted(settings, rr) == list(rr.block_hashes)
