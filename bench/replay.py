"""Live replay: send a workload to any OpenAI-compatible base URL at its real arrival times.

Each request is scheduled at `start + at_s / compress`, but not sent before the previous
request of its session has been answered (players wait for the reply); a semaphore caps
how many are in flight. Those waits are recorded (`sent_s` against `scheduled_s`) apart
from the TTFT, which is measured from the moment a request is sent. Requests are streamed chat
completions with `stream_options.include_usage`, so each record gets:

- `ttft_s`: send -> first chunk carrying generated text;
- `first_token_s`: send -> first chunk carrying a generated token, even one whose text is
  empty (`gateway.upstream.sse.has_token`): what an engine's own TTFT counts, so the time
  outside the engines compares like with like (a random-weight model's first tokens often
  print nothing: its first text came several decode steps after its first token, and 36
  of 154 answers of one seed never printed any);
- `gaps_s`: the times between successive text chunks (inter-token gaps);
- `e2e_s`: send -> end of stream;
- `status`, `error`, usage (`prompt_tokens`, `completion_tokens`, `cached_tokens` from
  `usage.prompt_tokens_details.cached_tokens`);
- `instance`: from `x-warmgate-instance`, else the engine's `x-engine-instance` if the
  gateway passes it through (as is, or LiteLLM's `llm_provider-` copy), else a header naming
  the upstream (LiteLLM's deployment id, `x-litellm-model-api-base`, smg's
  `x-smg-routed-worker-id`, mapped through `instance_by_url`); else None, and the caller
  attributes requests from the engines' own counters (`bench.engine_metrics`);
- `predicted_cached_tokens`: what the gateway predicted the engine would find cached, where
  it says so (`x-warmgate-cached-tokens`), to compare with the engine's `cached_tokens`;
- `gateway_headers`: the names of the response's `x-` headers (what a gateway exposes).

A progress line goes to stderr (rewritten in place on a terminal, every 10 s otherwise).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import httpx

from gateway.upstream.sse import has_token

# Checked in order: warmgate's own, the engine's (smg passes it through unchanged, LiteLLM
# prefixes upstream headers with `llm_provider-`), LiteLLM's deployment id (bench.peers sets
# it to the instance id).
INSTANCE_HEADERS = (
    "x-warmgate-instance",
    "x-engine-instance",
    "llm_provider-x-engine-instance",
    "x-litellm-model-id",
)
UPSTREAM_URL_HEADERS = ("x-litellm-model-api-base", "x-smg-routed-worker-id")
PREDICTED_CACHED_HEADERS = ("x-warmgate-cached-tokens",)


@dataclass(frozen=True, slots=True)
class ReplayItem:
    """One request of a workload: when it arrives (seconds from the start) and its body."""

    at_s: float
    messages: list[dict[str, Any]]
    max_tokens: int
    session: str | None = None
    tag: str = ""  # free-form origin (trace line, zone/player) for reports
    # a game server's hints (sim.players): warm the context (every message but the last)
    # this many seconds before the request arrives; the request's priority class
    warm_lead_s: float | None = None
    priority: str | None = None


@dataclass(slots=True)
class RequestRecord:
    """What one replayed request measured."""

    index: int
    scheduled_s: float  # its arrival time after compression, from the replay's start
    sent: bool = False  # False: never sent (the replay's time budget ran out first)
    sent_s: float = 0.0  # when it actually went out (later than scheduled under the cap)
    status: int = 0
    ok: bool = False
    ttft_s: float | None = None
    first_token_s: float | None = None  # the first token's chunk, its text empty or not
    e2e_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    instance: str | None = None
    predicted_cached_tokens: int | None = None
    gateway_headers: list[str] = field(default_factory=list)
    error: str | None = None
    # the POST /v1/warm sent ahead of it (replay's `warms`): its status and, when 200, the
    # answer's instance, source, prompt/cached/warmed tokens and ms; None when none was sent
    warm: dict[str, Any] | None = None
    # the W3C trace id of the `traceparent` it was sent with (replay's `trace`), else None
    trace_id: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (None for fewer than two tokens)."""
        if self.ttft_s is None or self.e2e_s is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_body(
    item: ReplayItem, model: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The chat-completions body for `item` (streamed, usage requested; `extra` fields added)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": item.messages,
        "max_tokens": item.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        **(extra or {}),
    }
    if item.session:
        body["user"] = item.session
        body["prompt_cache_key"] = item.session
    return body


def instance_from_headers(
    headers: Mapping[str, str], instance_by_url: Mapping[str, str]
) -> str | None:
    """The serving instance named by a response's headers, if any header names it."""
    for name in INSTANCE_HEADERS:
        value = headers.get(name)
        if value:
            return value
    for name in UPSTREAM_URL_HEADERS:
        value = headers.get(name)
        if value:
            key = value.rstrip("/").removesuffix("/v1")
            return instance_by_url.get(key, value)
    return None


def predicted_from_headers(headers: Mapping[str, str]) -> int | None:
    """The gateway's predicted cached tokens for this request, if a header says it."""
    for name in PREDICTED_CACHED_HEADERS:
        value = headers.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def _chunk_text(chunk: Mapping[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        text += str(delta.get("content") or "") + str(choice.get("text") or "")
    return text


def _read_usage(record: RequestRecord, usage: Mapping[str, Any]) -> None:
    record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    record.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if cached is not None:
        record.cached_tokens = int(cached)


async def send_one(
    client: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    record: RequestRecord,
    *,
    instance_by_url: Mapping[str, str],
    headers: Mapping[str, str] | None = None,
) -> None:
    """Stream one chat completion and fill `record` (never raises for HTTP trouble)."""
    start = time.perf_counter()
    last: float | None = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            record.status = resp.status_code
            record.instance = instance_from_headers(resp.headers, instance_by_url)
            record.predicted_cached_tokens = predicted_from_headers(resp.headers)
            record.gateway_headers = sorted(
                k.lower() for k in resp.headers if k.lower().startswith("x-")
            )
            if resp.status_code != 200:
                raw = await resp.aread()
                record.error = raw[:300].decode("utf-8", "replace")
                return
            got_done = False
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    got_done = True
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    record.error = json.dumps(chunk["error"])[:300]
                    return
                now = time.perf_counter()
                if record.first_token_s is None and has_token(chunk):
                    record.first_token_s = now - start
                if _chunk_text(chunk):
                    if last is None:
                        record.ttft_s = now - start
                    else:
                        record.gaps_s.append(now - last)
                    last = now
                usage = chunk.get("usage")
                if isinstance(usage, Mapping):
                    _read_usage(record, usage)
            record.e2e_s = time.perf_counter() - start
            record.ok = got_done and record.ttft_s is not None
            if not record.ok:
                record.error = "stream ended without [DONE]" if not got_done else "no text"
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]


async def send_warm(
    client: httpx.AsyncClient,
    url: str,
    item: ReplayItem,
    model: str,
    record: RequestRecord,
    headers: Mapping[str, str] | None,
) -> None:
    """POST /v1/warm of `item`'s context (every message but the last) for its session, as a
    game server does when a player walks up to an NPC; the outcome goes in `record.warm`."""
    body = {"model": model, "messages": item.messages[:-1], "user": item.session}
    try:
        resp = await client.post(url, json=body, headers=headers)
    except httpx.HTTPError as exc:
        record.warm = {"status": 0, "error": f"{type(exc).__name__}: {exc}"[:200]}
        return
    record.warm = {"status": resp.status_code}
    if resp.status_code == 200:
        answer = resp.json()
        keys = ("instance", "source", "prompt_tokens", "cached_tokens", "warmed_tokens", "ms")
        record.warm |= {k: answer.get(k) for k in keys}


def _request_headers(
    headers: Mapping[str, str] | None,
    item: ReplayItem,
    send_priority: bool,
    record: RequestRecord,
    trace: bool,
) -> Mapping[str, str] | None:
    extra: dict[str, str] = {}
    if send_priority and item.priority is not None:
        extra["x-warmgate-priority"] = item.priority
    if trace:  # a sampled trace of its own, as a traced client would send
        record.trace_id = secrets.token_hex(16)
        extra["traceparent"] = f"00-{record.trace_id}-{secrets.token_hex(8)}-01"
    return {**(headers or {}), **extra} if extra else headers


class Progress:
    """A one-line progress report on stderr."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.errors = self.in_flight = 0
        self._tty = self.stream.isatty()
        self._start = time.monotonic()
        self._last = 0.0

    def update(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.5 if self._tty else 10.0):
            return
        self._last = now
        width = 30
        filled = int(width * self.done / max(1, self.total))
        line = (
            f"[{self.label}] [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            f" in flight {self.in_flight} errors {self.errors} {now - self._start:6.1f}s"
        )
        self.stream.write(("\r" + line) if self._tty else (line + "\n"))
        if force and self._tty:
            self.stream.write("\n")
        self.stream.flush()


async def replay(
    base_url: str,
    items: Sequence[ReplayItem],
    *,
    model: str,
    compress: float = 1.0,
    concurrency: int = 256,
    closed_loop: bool = False,
    instance_by_url: Mapping[str, str] | None = None,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    progress_label: str | None = "replay",
    stop_after_s: float | None = None,
    session_order: bool = True,
    body_extra: Mapping[str, Any] | None = None,
    warms: bool = False,
    send_priority: bool = False,
    trace: bool = False,
) -> list[RequestRecord]:
    """Replay `items` against `base_url` (ending in `/v1`); one record per item, in order.

    With `closed_loop`, arrival times are ignored: requests go out as fast as the
    concurrency cap lets them (a fixed number of concurrent requests). With `stop_after_s`,
    no request is sent after that many seconds (those left have `sent` False); requests
    already sent run to completion. With `session_order`, a request is not sent before the
    previous request of its session has ended (a player waits for the NPC's answer before
    the next line, however late the answer is); that wait counts in `sent_s`, not in TTFT.
    With `warms`, an item with a session and `warm_lead_s` first has its context warmed
    (POST /v1/warm, warmgate's) that much earlier (compressed as arrivals are), whether or
    not the session's previous turn has ended; with `send_priority`, an item's priority
    class goes in `x-warmgate-priority` (gateways without them ignore the header). With
    `trace`, every request carries a `traceparent` of its own (sampled), its trace id in
    the record (`bench.tail_breakdown` finds its spans by it)."""
    if compress <= 0 or concurrency <= 0:
        raise ValueError("compress and concurrency must be positive")
    url = base_url.rstrip("/") + "/chat/completions"
    warm_url = base_url.rstrip("/") + "/warm"
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    by_url = dict(instance_by_url or {})
    order = sorted(range(len(items)), key=lambda i: items[i].at_s)
    t0 = items[order[0]].at_s if order else 0.0
    records = [
        RequestRecord(index=i, scheduled_s=0.0 if closed_loop else (it.at_s - t0) / compress)
        for i, it in enumerate(items)
    ]
    progress = Progress(len(items), progress_label) if progress_label else None
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        start = time.perf_counter()

        async def run(i: int, after: asyncio.Event | None, done: asyncio.Event) -> None:
            rec = records[i]
            try:
                if after is not None:  # the session's previous turn must have been answered
                    await after.wait()
                async with sem:
                    now = time.perf_counter() - start
                    if stop_after_s is not None and now > stop_after_s:
                        rec.error = "not sent: time budget over"
                        if progress:
                            progress.done += 1
                        return
                    rec.sent, rec.sent_s = True, now
                    if progress:
                        progress.in_flight += 1
                    await send_one(
                        client,
                        url,
                        build_body(items[i], model, body_extra),
                        rec,
                        instance_by_url=by_url,
                        headers=_request_headers(headers, items[i], send_priority, rec, trace),
                    )
            finally:
                done.set()
            if progress:
                progress.in_flight -= 1
                progress.done += 1
                progress.errors += 0 if rec.ok else 1
                progress.update()

        async def warm(i: int) -> None:
            lead = items[i].warm_lead_s or 0.0
            delay = (records[i].scheduled_s - lead / compress) - (time.perf_counter() - start)
            await asyncio.sleep(max(0.0, delay))
            await send_warm(client, warm_url, items[i], model, records[i], headers)

        tasks: list[asyncio.Task[None]] = []
        if warms and not closed_loop:
            tasks += [
                asyncio.create_task(warm(i))
                for i in order
                if items[i].session and items[i].warm_lead_s and len(items[i].messages) > 1
            ]
        last_of_session: dict[str, asyncio.Event] = {}
        for i in order:
            if stop_after_s is not None and time.perf_counter() - start > stop_after_s:
                records[i].error = "not sent: time budget over"
                if progress:
                    progress.done += 1
                continue
            if not closed_loop:
                delay = records[i].scheduled_s - (time.perf_counter() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
            session = items[i].session if session_order else None
            after = last_of_session.get(session) if session else None
            done = asyncio.Event()
            if session:
                last_of_session[session] = done
            tasks.append(asyncio.create_task(run(i, after, done)))
            if closed_loop:
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
    if progress:
        progress.update(force=True)
    return records
