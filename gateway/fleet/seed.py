"""The one precise-mode setting an engine does not publish: its block-hash seed (vLLM's
`PYTHONHASHSEED`). When the instance being added names its KV events endpoint, the seed is
checked by experiment: subscribe, send the engine one short completion that no cache can
hold (a fresh first block), and hash the token ids of the first `BlockStored` chain it
reports the way the gateway would (its engine kind's hash and KV event wire, `spec.adapter`,
with `routing.precise`); the hashes must be the engine's own. A kind that seeds randomly
without a configured seed fails the check.

An engine without a KV events endpoint cannot be checked this way; the check is then left
out of the answer (the gateway still hashes with `routing.precise.hash_seed`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import httpx
import zmq
import zmq.asyncio

from contracts.errors import ConfigurationError
from contracts.kv_events import BlockStored, MalformedEventError
from gateway.config.settings import InstanceSettings, RoutingSettings
from gateway.fleet.checks import Check

SLOW_JOINER_S = 0.3  # a ZMQ publisher drops what it sends before our subscription arrives


async def check_hash_seed(
    client: httpx.AsyncClient,
    spec: InstanceSettings,
    routing: RoutingSettings,
    model: str,
    timeout_s: float,
) -> Check | None:
    p = routing.precise
    if routing.mode != "precise" or p.hash != "vllm" or not spec.kv_events_endpoint:
        return None
    engine = spec.adapter
    try:
        hashing = p.hashing([engine])
    except ConfigurationError as exc:
        return Check("hash_seed", False, str(exc))
    seed = hashing.seed
    size = p.effective_block_size
    hasher = hashing.hasher(size)
    wire = engine.kv_events
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt_string(zmq.SUBSCRIBE, "")
    sock.connect(spec.kv_events_endpoint)
    try:
        await asyncio.sleep(SLOW_JOINER_S)
        # a fresh first block, then ~2 blocks of filler (a CPU engine computes ~300 tokens/s)
        probe = f"warmgate seed probe {uuid.uuid4().hex}." + " the quick brown fox" * size
        body = {"model": model, "prompt": probe, "max_tokens": 1}
        try:
            r = await client.post(f"{spec.url}/v1/completions", json=body, timeout=timeout_s)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            return Check("hash_seed", False, f"probe completion failed: {type(exc).__name__}")
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                frames = await asyncio.wait_for(sock.recv_multipart(), timeout=left)
                try:
                    batch = wire.decode_batch(wire.decode_frames(frames).payload)
                except MalformedEventError:
                    continue
                for ev in batch.events:
                    if not isinstance(ev, BlockStored) or ev.parent_block_hash is not None:
                        continue
                    ours = hasher.block_hashes(ev.token_ids)
                    n = min(len(ours), len(ev.block_hashes))
                    if n == 0:
                        continue
                    ok = list(ev.block_hashes[:n]) == ours[:n]
                    detail = (
                        f"{n} blocks of the engine's KV events hash as routing.precise.hash_seed"
                        f" {seed!r} does"
                        if ok
                        else f"the engine's block hashes differ from those of hash_seed "
                        f"{seed!r} (another PYTHONHASHSEED, or a random one)"
                    )
                    return Check("hash_seed", ok, detail)
        return Check(
            "hash_seed",
            False,
            f"no BlockStored event from {spec.kv_events_endpoint} within {timeout_s:g}s",
        )
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)
