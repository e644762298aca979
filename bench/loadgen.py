"""A bounded game load for the fault and soak benchmarks: players talking to NPCs (a stable
system prompt, a history that grows turn by turn and restarts past a bound), as streamed
chat requests at Poisson arrivals, each recorded: status, time to first token, whether it
failed before its first byte or mid-stream, whether it was continued, and its text.

A request's answer is checked against the simulated model: the simulator's text is a
function of the prompt alone, so every instance must answer a given prompt alike. An
answer is wrong when its stream is malformed (several ids in one stream, an empty answer)
or, for an answer not continued, when its text differs from what a healthy engine, asked
directly afterwards, answers to the same prompt (`verify`). A continued answer is checked
for its shape only: its tail comes from a longer prompt by design.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import math
import random
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.sim_fleet import MODEL

PERSONA = (
    "You are Maren, the blacksmith of Northwatch. You speak briefly, you remember every "
    "traveler who paid you, and you never reveal the location of the old forge. "
)


@dataclass
class Result:
    started: float
    status: int = 0
    ttft_s: float | None = None
    duration_s: float = 0.0
    failed_before_first_byte: bool = False
    failed_mid_stream: bool = False
    continued: bool = False
    wrong: str | None = None
    text: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    instance: str | None = None
    error: str | None = None


class Rows:
    """What a soak keeps of each request (started, status, TTFT, failed mid-stream, error),
    in arrays: each one object to the garbage collector however long it grows. A client
    keeping hundreds of thousands of Results (each a tracked object) paused longer at every
    full collection as the run went on, and each pause delayed every stream it was reading."""

    def __init__(self) -> None:
        self.started = array("d")
        self.status = array("i")
        self.ttft_s = array("d")  # NaN: no first token
        self.mid_stream = bytearray()  # 1: failed after its first byte
        self.errors: dict[int, str] = {}  # by row; rare

    def add(self, res: Result) -> None:
        if res.error is not None:
            self.errors[len(self.started)] = res.error
        self.started.append(res.started)
        self.status.append(res.status)
        self.ttft_s.append(math.nan if res.ttft_s is None else res.ttft_s)
        self.mid_stream.append(res.failed_mid_stream)

    def __len__(self) -> int:
        return len(self.started)

    def results(self) -> list[Result]:
        return [
            Result(
                started=self.started[i],
                status=self.status[i],
                ttft_s=None if math.isnan(self.ttft_s[i]) else self.ttft_s[i],
                failed_mid_stream=bool(self.mid_stream[i]),
                error=self.errors.get(i),
            )
            for i in range(len(self.started))
        ]


@dataclass
class Player:
    pid: int
    history: list[dict[str, str]] = field(default_factory=list)
    turn: int = 0

    def messages(self, max_turns: int) -> list[dict[str, str]]:
        if len(self.history) >= 2 * max_turns:
            self.history = []
        self.turn += 1
        line = {"role": "user", "content": f"Player {self.pid}, turn {self.turn}: any news?"}
        return [{"role": "system", "content": PERSONA * 4}, *self.history, line]


class Load:
    """Open-loop arrivals against one or more gateway URLs (tried in order on failure, as a
    client with a retry would)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        players: int = 50,
        first_player: int = 0,
        max_tokens: int = 24,
        max_turns: int = 6,
        seed: int = 7,
        retry_other: bool = False,
        max_in_flight: int = 400,
        keep: bool = True,
        model: str = MODEL,
        body_extra: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.body_extra = {"ignore_eos": True} if body_extra is None else body_extra
        # keep each request's Result, body and text (for `verify`); a soak keeps `rows` only
        self.keep = keep
        self.urls = list(urls)
        self.players = [Player(first_player + i) for i in range(players)]
        self.max_tokens = max_tokens
        self.max_turns = max_turns
        self.rng = random.Random(seed)
        self.retry_other = retry_other
        self.results: list[Result] = []
        self.rows = Rows()  # when not `keep`
        self.shed = 0
        self.lag = array("d")  # run(): how late each arrival started, s
        self._sem = asyncio.Semaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        self._session: aiohttp.ClientSession | None = None  # made on the loop that uses it

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def _client(self) -> aiohttp.ClientSession:
        # aiohttp, not httpx: httpx's pool spent 1.6-12 ms of CPU a request, rising with the
        # streams in flight, until one load process saturated its core and fell behind the
        # gateway; aiohttp spends 0.4-0.5 ms at 16-400 streams (measured on the soak's fleet)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=60.0),
                connector=aiohttp.TCPConnector(limit=self._max_in_flight),
            )
        return self._session

    async def run(self, rate: float, duration_s: float) -> None:
        """Poisson arrivals at `rate` per second for `duration_s` of wall time, then waits for
        the last to end (each recorded: `recorded()`). It keeps its schedule: every arrival
        already due starts at once, so a loop busy reading streams falls behind by one
        iteration, not by a backlog that stretches the run; how late each started is in
        `lag`."""
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        nxt = loop.time()
        while nxt < end:
            now = loop.time()
            if nxt > now:
                await asyncio.sleep(nxt - now)
                now = loop.time()
            while nxt <= now and nxt < end:
                self.lag.append(now - nxt)
                if self._sem.locked():
                    self.shed += 1
                else:
                    task = asyncio.create_task(self._one(self.rng.choice(self.players)))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                nxt += self.rng.expovariate(rate)
        if tasks:
            await asyncio.gather(*tasks)

    def recorded(self) -> list[Result]:
        """Every request so far: its Result (`keep`), or rebuilt from its row."""
        return self.results if self.keep else self.rows.results()

    async def closed_loop(self, concurrency: int, duration_s: float) -> float:
        """Completed requests per second with `concurrency` clients always waiting."""
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        done = 0

        async def worker(i: int) -> None:
            nonlocal done
            while loop.time() < end:
                await self._one(self.players[i % len(self.players)])
                done += 1

        started = loop.time()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return done / (loop.time() - started)

    async def _one(self, player: Player) -> None:
        async with self._sem:
            messages = player.messages(self.max_turns)
            body = {
                "model": self.model,
                "messages": messages,
                "max_tokens": self.max_tokens,
                "stream": True,
                "user": f"player-{player.pid}",
                **self.body_extra,
            }
            res = Result(started=time.monotonic(), body=body)
            for i, url in enumerate(self.urls):
                await self._stream(url, body, res)
                retryable = res.status == 0 or res.status >= 500
                if not (self.retry_other and retryable and i + 1 < len(self.urls)):
                    break
                if res.ttft_s is not None:
                    break  # bytes reached the player: a retry would repeat them
            res.duration_s = time.monotonic() - res.started
            self._check(res)
            if res.status == 200 and res.wrong is None:
                player.history += [messages[-1], {"role": "assistant", "content": res.text}]
            if self.keep:
                self.results.append(res)
            else:
                self.rows.add(res)

    async def _stream(self, url: str, body: dict[str, Any], res: Result) -> None:
        res.status, res.error, res.text = 0, None, ""
        res.failed_before_first_byte = res.failed_mid_stream = False
        try:
            async with self._client.post(f"{url}/v1/chat/completions", json=body) as r:
                res.status = r.status
                res.instance = r.headers.get("x-warmgate-instance")
                if r.status != 200:
                    await r.read()
                    res.failed_before_first_byte = True
                    res.error = f"status {r.status}"
                    return
                await self._read_events(r, res)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if res.ttft_s is None:
                res.failed_before_first_byte = True
            else:
                res.failed_mid_stream = True
            res.error = f"{type(exc).__name__}: {exc}"

    async def _read_events(self, r: aiohttp.ClientResponse, res: Result) -> None:
        ids: set[str] = set()
        done = False
        buf = ""
        utf8 = codecs.getincrementaldecoder("utf-8")()
        async for data in r.content.iter_any():
            buf += utf8.decode(data)
            *frames, buf = buf.split("\n\n")
            for frame in frames:
                if frame.startswith(":"):
                    res.continued = res.continued or "warmgate continued" in frame
                    continue
                if not frame.startswith("data: "):
                    continue
                payload = frame[6:]
                if payload == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    res.failed_mid_stream = True
                    res.error = str(chunk["error"].get("message"))
                    continue
                ids.add(str(chunk.get("id")))
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece and res.ttft_s is None:
                        res.ttft_s = time.monotonic() - res.started
                    res.text += piece
        if not done and res.error is None:
            res.failed_mid_stream = True
            res.error = "no [DONE]"
        if len(ids) > 1:
            res.wrong = f"{len(ids)} chunk ids in one stream"

    def _check(self, res: Result) -> None:
        if res.status == 200 and not res.failed_mid_stream and not res.text:
            res.wrong = "empty answer"

    async def _engine_text(self, engine_url: str, res: Result) -> str | None:
        """The engine's own non-streamed answer to `res`'s prompt, or None if it failed."""
        body = {**res.body, "stream": False}
        async with self._client.post(f"{engine_url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                return None
            text: str = (await r.json())["choices"][0]["message"]["content"]
        return text

    async def continued_identical(self, engine_url: str) -> tuple[int, int]:
        """Of the answers continued on another instance, how many equal the healthy engine's
        own uninterrupted answer to the same prompt: (checked, identical). On real engines
        with greedy decoding that is what "the client cannot tell" means; the simulator's
        text is a function of the prompt, so there a continued tail differs by design."""
        continued = [r for r in self.results if r.continued and r.status == 200 and r.body]
        gate = asyncio.Semaphore(16)

        async def one(res: Result) -> bool:
            async with gate:
                return await self._engine_text(engine_url, res) == res.text

        same = await asyncio.gather(*(one(r) for r in continued))
        return len(continued), sum(same)

    async def verify(self, engine_url: str, sample: int = 300) -> int:
        """Ask a healthy engine directly for (a sample of) the answers served whole and not
        continued; mark those whose text differs. Returns how many were checked."""
        served = [
            r for r in self.results
            if r.status == 200 and not r.failed_mid_stream and not r.continued and not r.wrong
        ]  # fmt: skip
        self.rng.shuffle(served)
        checked = served[:sample]
        gate = asyncio.Semaphore(16)

        async def one(res: Result) -> None:
            async with gate:
                text = await self._engine_text(engine_url, res)
            if text != res.text:
                res.wrong = "text differs from the engine's own answer to the same prompt"

        await asyncio.gather(*(one(r) for r in checked))
        return len(checked)


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]
