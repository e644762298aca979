"""Precise mode at the gateway: a request's block chain cut from its real tokens and hashed
exactly as the engines hash their KV blocks, so the router's index, its predictions and the
engines' KV events all speak of the same blocks.

Tokens come from a local tokenizer when one is configured (`routing.precise.tokenizer_dir`:
the engines' Hugging Face tokenizer files, `pipeline.hf_tokenizer`, which passes what it cannot
reproduce exactly to /tokenize; or `routing.precise.tokenizer`, "module:factory": the factory
returns a callable taking the tokenize payload and returning token ids, sync or async), else
from an engine's tokenize route, through its engine kind (`Engine.tokenize_path`,
`tokenize_body`, `tokens`: vLLM's `POST /tokenize`, whose body the tokenize payload is; chat
requests send `messages` and `tools`, so the engine applies its own chat template; the
healthy candidates take turns). Hashing is the fleet's engines' (`Settings.fleet_hashing`,
`gateway.engine.hashing`: vLLM's `sha256_cbor` / `xxhash_cbor` with the engines' hash seed),
or warmgate's xxh3 chain. When tokens cannot be had (no answer in time, a prompt shape the
engine's tokenize route does not take) the request is routed in approximate mode and the
fallback is counted: routing never fails because of it.
"""

from __future__ import annotations

import itertools
import logging
import pkgutil
from collections.abc import Sequence
from typing import Any

import httpx

from contracts.errors import ConfigurationError, RoutingError
from gateway.config.settings import PreciseSettings
from gateway.engine.hashing import FleetHashing
from gateway.fleet.health import HealthChecker
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.hf_tokenizer import HfChatTokenizer, LocalTokenizeUnsupported
from gateway.pipeline.parse import ParsedRequest
from router.precise import (
    BlockHasher,
    Tokenizer,
    Xxh3BlockHasher,
    precise_route_request,
    tokens_of,
)
from router.types import RouteRequest

log = logging.getLogger("warmgate.tokens")


class TokenizerSpecError(ConfigurationError, ValueError):
    """`routing.precise.tokenizer` is not `module:factory`."""


class TokenizeUnavailable(RoutingError):
    """No tokens for this request: route it in approximate mode."""


def load_tokenizer(spec: str) -> Tokenizer:
    """The local tokenizer named `module:factory` (the factory is called once)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise TokenizerSpecError(
            f"routing.precise.tokenizer must be 'module:factory', not {spec!r}"
        )
    factory = pkgutil.resolve_name(spec)  # a user's tokenizer, named in the settings
    tokenizer: Tokenizer = factory()
    return tokenizer


def tokenize_payload(parsed: ParsedRequest) -> dict[str, Any]:
    """What to tokenize of this request, the shape local tokenizers take (and vLLM's
    `/tokenize` body; an engine kind makes its own body of it, `Engine.tokenize_body`)."""
    body = parsed.body
    if parsed.kind == "chat":
        payload: dict[str, Any] = {
            "model": parsed.model,
            "messages": body["messages"],
            "add_generation_prompt": True,
        }
        if body.get("tools"):
            payload["tools"] = body["tools"]
        return payload
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise TokenizeUnavailable("only a single text prompt can be tokenized")
    return {"model": parsed.model, "prompt": prompt}


class PreciseChains:
    """Builds token-exact `RouteRequest`s; one per app. `hashing`: the engines' block hash
    (None: warmgate's xxh3 chain, `routing.precise.hash: xxh3`)."""

    def __init__(
        self,
        settings: PreciseSettings,
        hashing: FleetHashing | None,
        client: httpx.AsyncClient,
        health: HealthChecker,
        metrics: GatewayMetrics,
    ) -> None:
        self._settings = settings
        self._client = client
        self._health = health
        self._metrics = metrics
        self._turn = itertools.count()
        self._local: Tokenizer | None = None
        if settings.tokenizer_dir is not None:
            self._local = HfChatTokenizer(
                settings.tokenizer_dir, segment_cache_tokens=settings.segment_cache_tokens
            )
        elif settings.tokenizer is not None:
            self._local = load_tokenizer(settings.tokenizer)
        self._xxh3: dict[str, Xxh3BlockHasher] = {}  # per model (seeded by it)
        self._engines = (
            hashing.hasher(settings.effective_block_size) if hashing is not None else None
        )

    def _hasher(self, model: str) -> BlockHasher:
        if self._engines is not None:
            return self._engines
        hasher = self._xxh3.get(model)
        if hasher is None:
            hasher = self._xxh3[model] = Xxh3BlockHasher(
                model=model, block_size=self._settings.effective_block_size
            )
        return hasher

    async def _engine_tokenize(
        self, payload: dict[str, Any], candidates: Sequence[str]
    ) -> Sequence[int]:
        instance = candidates[next(self._turn) % len(candidates)]
        engine = self._health.engine_of(instance)
        url = f"{self._health.instance_url(instance)}{engine.tokenize_path}"
        resp = await self._client.post(
            url, json=engine.tokenize_body(payload), timeout=self._settings.tokenize_timeout_s
        )
        resp.raise_for_status()
        tokens = engine.tokens(resp.json())
        if tokens is None:
            raise TokenizeUnavailable(f"{instance}{engine.tokenize_path} answered no token list")
        return tokens

    def _ids(self, tokens: Any) -> Sequence[int]:
        self._metrics.precise_tokenized.labels("ids").inc()
        return list(tokens)

    async def _tokens(self, payload: dict[str, Any], candidates: Sequence[str]) -> Sequence[int]:
        """From the local tokenizer when it reproduces this request, else from an engine."""
        if self._local is not None:
            try:
                local = await tokens_of(self._local, payload)
                self._metrics.precise_tokenized.labels("local").inc()
                return local
            except LocalTokenizeUnsupported as exc:  # the engine renders it
                log.debug("local tokenizer passes to /tokenize: %s", exc)
        tokens = await self._engine_tokenize(payload, candidates)
        self._metrics.precise_tokenized.labels("engine").inc()
        return tokens

    async def route_request(
        self, parsed: ParsedRequest, candidates: Sequence[str]
    ) -> RouteRequest | None:
        """The token-exact request, or None (counted) when tokens could not be had."""
        prompt = parsed.body.get("prompt")
        try:
            payload: Any
            tokenize: Tokenizer
            if (
                parsed.kind == "completion"
                and isinstance(prompt, list)
                and prompt
                and all(isinstance(t, int) for t in prompt)
            ):
                payload, tokenize = prompt, self._ids
            else:
                payload = tokenize_payload(parsed)

                async def tokenize(p: Any) -> Sequence[int]:
                    return await self._tokens(p, candidates)

            return await precise_route_request(
                payload,
                tokenize=tokenize,
                hasher=self._hasher(parsed.model),
                model=parsed.model,
                cache_salt=parsed.cache_salt,
                lora_name=parsed.model if parsed.model in self._settings.lora_adapters else None,
                lora_path=self._settings.lora_adapters.get(parsed.model),
                session_key=parsed.session_key,
                max_tokens=parsed.max_tokens,
            )
        except (httpx.HTTPError, TokenizeUnavailable, ValueError, TypeError) as exc:
            self._metrics.precise_fallbacks.inc()
            log.warning("precise mode unavailable, routing approximately: %r", exc)
            return None
