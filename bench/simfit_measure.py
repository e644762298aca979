"""Measure the real CPU engine for `warmgate bench simfit` (issue 24 item 5): two fresh vLLM
engines exactly as `bench compare --engines vllm --scale cpu-overflow` starts them (the tiny
local model, one core each, 48 KV blocks of 128 tokens), then, from a client as the join
probe is (gateway/fleet/calibration_probe.py: chat prompts, each with its own `cache_salt`,
one after another):

- `cold`: lone cold prompts of several sizes on one engine while the other idles;
- `cached`: a prompt, then the same prompt (same salt) with more text after it, so the
  second one computes only its tail after a cached context (the attention term);
- `paired`: the same cold prompt on both engines at once (two engines on two cores, with
  the API servers, the gateway and tierd between them);
- `decode`: streams of 32 tokens on one engine, alone with a short and a long context and
  four at once (the decode step);
- `batch`: four cold prompts on one engine at once;
- `replay` (with a seed): that seed's game workload sent straight to the engines in turn at
  its arrival times, the engines alone at a real run's load.

Every sample keeps the client's TTFT and end time, the engine's own prompt and cached token
counts (`usage`), and each phase keeps the engines' Prometheus histograms before and after
(`vllm:request_prefill_time_seconds`, `vllm:time_to_first_token_seconds`,
`vllm:iteration_tokens_total`, `vllm:inter_token_latency_seconds`, ...), so the fit can
compare the client's view with the engine's. Nothing here is fitted: `sim.fit` does that.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.real_fleet import VLLM_BODY_EXTRA, RealFleet, RealFleetSpec
from bench.workloads import OVERFLOW_DEFAULTS, game_items
from sim.players.text import TextSource

COLD_CHARS = (300, 1200, 2500, 4000, 6000, 8500, 11000, 14000)  # ~130-5,800 tokens
CACHED_PAIRS = ((3000, 2000), (7500, 2000), (11000, 2000))  # (context chars, tail chars)
PAIRED_CHARS = (2500, 6000, 11000)
# (streams at once, prompt chars): short and long contexts alone, then a batch of short ones,
# so the per-sequence and per-KV-token terms are told apart
DECODE_CASES = ((1, 1000), (1, 10000), (4, 1000))
DECODE_TOKENS = 32
REPEATS = 2
HISTOGRAMS = (
    "vllm:request_prefill_time_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:iteration_tokens_total",
    "vllm:inter_token_latency_seconds",
    "vllm:request_decode_time_seconds",
)
COUNTERS = ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:prompt_tokens_cached")
BATCH_PROMPTS = 4  # `batch`: this many ~1k-token cold prompts on one engine at once


def histogram_sums(metrics_text: str) -> dict[str, dict[str, float]]:
    """Each wanted histogram's `sum` and `count` from an engine's /metrics page."""
    out: dict[str, dict[str, float]] = {}
    wanted = {h.removesuffix("_total") for h in HISTOGRAMS} | set(HISTOGRAMS)
    for family in text_string_to_metric_families(metrics_text):
        if family.name in COUNTERS:  # a counter: its value as `sum`, one `count`
            out[family.name] = {
                "sum": sum(s.value for s in family.samples if s.name.endswith("_total")),
                "count": 1.0,
            }
            continue
        if family.name not in wanted:
            continue
        entry = out.setdefault(family.name, {"sum": 0.0, "count": 0.0})
        for s in family.samples:
            if s.name.endswith("_sum"):
                entry["sum"] += s.value
            elif s.name.endswith("_count"):
                entry["count"] += s.value
    return out


class EngineClient:
    """Timed chat requests to one engine, as the probe sends them."""

    def __init__(self, client: httpx.AsyncClient, url: str, model: str) -> None:
        self.client, self.url, self.model = client, url, model

    async def metrics(self) -> dict[str, dict[str, float]]:
        r = await self.client.get(f"{self.url}/metrics")
        r.raise_for_status()
        return histogram_sums(r.text)

    async def chat(self, text: str, salt: str, max_tokens: int) -> dict[str, Any]:
        return await self.messages([{"role": "user", "content": text}], salt, max_tokens)

    async def messages(
        self, messages: list[dict[str, Any]], salt: str | None, max_tokens: int
    ) -> dict[str, Any]:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **({"cache_salt": salt} if salt else {}),
            **VLLM_BODY_EXTRA,
        }
        sent = time.perf_counter()
        first: float | None = None
        usage: dict[str, Any] = {}
        async with self.client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and first is None:
                    first = time.perf_counter()
                if chunk.get("usage"):
                    usage = chunk["usage"]
        end = time.perf_counter()
        details = usage.get("prompt_tokens_details") or {}
        return {
            "prompt_tokens": int(usage.get("prompt_tokens", 0)),
            "cached_tokens": int(details.get("cached_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens", 0)),
            "ttft_s": (first or end) - sent,
            "e2e_s": end - sent,
            "load_1m": os.getloadavg()[0],
        }


def _salt() -> str:
    return f"simfit-{uuid.uuid4().hex}"


async def _phase(name: str, engines: list[EngineClient], body: Any, out: dict[str, Any]) -> None:
    before = [await e.metrics() for e in engines]
    started = time.perf_counter()
    samples = await body()
    after = [await e.metrics() for e in engines]
    out[name] = {
        "samples": samples,
        "wall_s": time.perf_counter() - started,
        "metrics_delta": [
            {k: {f: a[k][f] - b.get(k, {}).get(f, 0.0) for f in ("sum", "count")} for k in a}
            for b, a in zip(before, after, strict=True)
        ],
    }


async def measure(
    engines: list[EngineClient],
    text: TextSource,
    replay_seed: int | None,
    replay_first: bool = False,
) -> dict[str, Any]:
    """Every phase on `engines` (two), in order (the replay first with `replay_first`: on
    engines as fresh as a `bench compare` run's); returns the raw samples."""
    out: dict[str, Any] = {}
    one = engines[0]

    async def cold() -> list[dict[str, Any]]:
        rows = []
        for _ in range(REPEATS):
            for chars in COLD_CHARS:
                for k, e in enumerate(engines):
                    rows.append({"engine": k, **await e.chat(text.prose(chars // 4), _salt(), 1)})
        return rows

    async def cached() -> list[dict[str, Any]]:
        rows = []
        for _ in range(REPEATS):
            for ctx, tail in CACHED_PAIRS:
                salt, head = _salt(), text.prose(ctx // 4)
                first = await one.chat(head, salt, 1)
                second = await one.chat(head + " " + text.prose(tail // 4), salt, 1)
                rows.append({"context": first, **second})
        return rows

    async def paired() -> list[dict[str, Any]]:
        rows = []
        for _ in range(REPEATS):
            for chars in PAIRED_CHARS:
                prompt = text.prose(chars // 4)
                both = await asyncio.gather(*(e.chat(prompt, _salt(), 1) for e in engines))
                rows += [{"engine": k, **s} for k, s in enumerate(both)]
        return rows

    async def decode() -> list[dict[str, Any]]:
        rows = []
        for case, (batch, chars) in enumerate(DECODE_CASES):
            prompts = [text.prose(chars // 4) for _ in range(batch)]
            got = await asyncio.gather(*(one.chat(p, _salt(), DECODE_TOKENS) for p in prompts))
            rows += [{"case": case, "batch": batch, **s} for s in got]
        return rows

    async def batch() -> list[dict[str, Any]]:
        prompts = [text.prose(625) for _ in range(BATCH_PROMPTS)]
        got = await asyncio.gather(*(one.chat(p, _salt(), 1) for p in prompts))
        return [{"batch": BATCH_PROMPTS, **s} for s in got]

    async def replay() -> list[dict[str, Any]]:
        assert replay_seed is not None  # the phase runs only with a seed
        return await replay_game(engines, replay_seed)

    phases = (("cold", cold), ("cached", cached), ("paired", paired), ("decode", decode),
              ("batch", batch), ("replay", replay))  # fmt: skip
    if replay_first:
        phases = phases[-1:] + phases[:-1]
    for name, body in phases:
        if name != "replay" or replay_seed is not None:
            await _phase(name, engines, body, out)
    return out


async def replay_game(engines: list[EngineClient], seed: int) -> list[dict[str, Any]]:
    """The game workload of `seed` (bench compare's cpu-overflow scale and size) sent
    straight to the engines in turn (round robin) at its arrival times: the engines alone at
    the load a real run puts on them, to check the simulator on (its `round_robin`)."""
    items = game_items(OVERFLOW_DEFAULTS["players"], 1.5, seed, "cpu-overflow")
    start = time.perf_counter()

    async def one(i: int, item: Any) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, item.at_s - (time.perf_counter() - start)))
        got = await engines[i % len(engines)].messages(item.messages, None, item.max_tokens)
        return {"request": i, "engine": i % len(engines), "at_s": item.at_s, **got}

    return list(await asyncio.gather(*(one(i, it) for i, it in enumerate(items))))


def measure_to(
    out_path: Path, replay_seed: int | None = None, replay_first: bool = False
) -> dict[str, Any]:
    """`run_measure`, its result written to `out_path` (JSON)."""
    result = asyncio.run(run_measure(replay_seed, replay_first))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    return result


async def run_measure(replay_seed: int | None = None, replay_first: bool = False) -> dict[str, Any]:
    """Start the engines, warm them (as bench compare does), measure, stop them."""
    spec = RealFleetSpec(instances=2, num_gpu_blocks=OVERFLOW_DEFAULTS["engine_kv_blocks"])
    workdir = Path(tempfile.mkdtemp(prefix="wg-fit-"))
    fleet = RealFleet(spec, workdir)
    started = time.time()
    try:
        await fleet.start()  # waits for /health, warms each engine with one request
        async with httpx.AsyncClient(timeout=300.0, trust_env=False) as client:
            engines = [EngineClient(client, url, fleet.model) for url in fleet.engines.values()]
            for e in engines:  # a second warm-up of the probe's own shape, untimed
                await e.chat(TextSource(1).prose(400), _salt(), 1)
            phases = await measure(engines, TextSource(2026), replay_seed, replay_first)
    finally:
        await fleet.stop()
    result = {
        "what": "the real CPU engine as bench compare --scale cpu-overflow starts it",
        "engine_args": {
            "num_gpu_blocks": spec.num_gpu_blocks,
            "block_size": fleet.block_size,
            "max_model_len": fleet.cfg.max_model_len,
            "cores": "one each (VLLM_CPU_OMP_THREADS_BIND)",
        },
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": time.time() - started,
        "cpus": os.cpu_count(),
        "replay_seed": replay_seed,
        "replay_first": replay_first,
        "phases": phases,
    }
    return result
