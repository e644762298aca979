"""Request bodies a schema-driven fuzzer never writes: valid completion requests with one
hostile mutation each (a lone surrogate escape, a NaN or Infinity literal, an integer past
64 bits, nesting thousands deep, a duplicated key, invalid UTF-8, a truncation, a huge
session key, random bytes), seeded, so a failing case can be replayed by its number.
`send()` posts each to the gateway; any 5xx is a finding."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

_FIELDS = ("model", "user", "prompt_cache_key", "cache_salt", "content", "role")


@dataclass(frozen=True)
class Case:
    n: int
    kind: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def _template(model: str, chat: bool, rng: random.Random) -> dict[str, object]:
    body: dict[str, object] = {"model": model, "max_tokens": rng.randint(1, 4)}
    if chat:
        body["messages"] = [{"role": "user", "content": "hail"}]
    else:
        body["prompt"] = "hail"
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.5:
        body["user"] = f"player-{rng.randint(0, 9)}"
    return body


def _put(body: bytes, name: str, raw_value: bytes) -> bytes:
    """Set `name`'s value to the raw JSON text `raw_value` (appended as a last key)."""
    return body[:-1] + b', "' + name.encode() + b'": ' + raw_value + b"}"


def _in_content(body: bytes, raw_value: bytes) -> bytes:
    return body.replace(b'"hail"', raw_value, 1)


def mutate(n: int, model: str, rng: random.Random) -> Case:
    chat = rng.random() < 0.6
    path = rng.choice(
        ["/v1/chat/completions"] * 4 + ["/v1/completions"] * 2 + ["/admin/route/explain"]
    )
    if path == "/v1/completions":
        chat = False
    elif path == "/v1/chat/completions":
        chat = True
    body = json.dumps(_template(model, chat, rng)).encode()
    kind = rng.choice(
        ["surrogate", "nan", "bigint", "deep", "duplicate", "utf8", "truncate", "session",
         "random", "float_overflow", "wrong_types", "empty"]
    )  # fmt: skip
    headers: dict[str, str] = {}
    if kind == "surrogate":
        esc = rng.choice([b'"\\ud800"', b'"a\\udfffb"', b'"\\ud83d"', b'"\xed\xa0\x80"'])
        name = rng.choice(_FIELDS)
        body = _in_content(body, esc) if name == "content" else _put(body, name, esc)
    elif kind == "nan":
        lit = rng.choice([b"NaN", b"Infinity", b"-Infinity"])
        body = _put(body, rng.choice(["temperature", "top_p", "max_tokens", "seed", "n"]), lit)
    elif kind == "bigint":
        big = str(rng.choice([2**64, 2**100, -(2**70), 10**4000])).encode()
        body = _put(body, rng.choice(["max_tokens", "seed", "n", "temperature", "logprobs"]), big)
        if rng.random() < 0.3 and not chat:
            body = body.replace(b'"hail"', b"[" + big + b"]", 1)
    elif kind == "deep":
        depth = rng.choice([65, 500, 5000, 50_000])
        opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
        nested = opener * depth + b"1" + closer * depth
        body = _put(body, rng.choice(["metadata", "tools", "stop", "x"]), nested)
    elif kind == "duplicate":
        body = body[:-1] + b', "model": ' + json.dumps(rng.choice(["x", 1, None])).encode() + b"}"
    elif kind == "utf8":
        bad = rng.choice([b"\xff", b"\xc3", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\xc0\xaf"])
        body = body.replace(b"hail", b"ha" + bad + b"il", 1)
    elif kind == "truncate":
        body = body[: rng.randint(0, len(body) - 1)]
    elif kind == "session":
        size = rng.choice([257, 10_000, 300_000])
        if rng.random() < 0.5:
            body = _put(body, "user", json.dumps("u" * size).encode())
        else:
            headers["x-session-id"] = "s" * min(size, 60_000)
    elif kind == "random":
        body = rng.randbytes(rng.randint(0, 300))
    elif kind == "float_overflow":
        body = _put(body, rng.choice(["temperature", "max_tokens"]), b"1e400")
    elif kind == "wrong_types":
        name = rng.choice(["messages", "prompt", "stream", "stream_options", "max_tokens", "user"])
        value = rng.choice(
            [b"{}", b"[]", b"true", b"0", b'"x"', b"null", b"[null]", b'[{"role": 1}]']
        )
        body = _put(body, name, value)
    elif kind == "empty":
        body = rng.choice([b"", b" ", b"{}", b"[]", b"null"])
    return Case(n, kind, path, body, headers)


def cases(count: int, model: str, seed: int = 13) -> Iterator[Case]:
    rng = random.Random(seed)
    for n in range(count):
        yield mutate(n, model, rng)


@dataclass
class Tally:
    cases: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    server_errors: list[dict[str, object]] = field(default_factory=list)


async def send(
    base: str, count: int, model: str, admin_key: str | None = None, seed: int = 13
) -> Tally:
    tally = Tally()
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for case in cases(count, model, seed):
            headers = {"content-type": "application/json", **case.headers}
            if admin_key:
                headers["authorization"] = f"Bearer {admin_key}"
            r = await client.post(case.path, content=case.body, headers=headers)
            tally.cases += 1
            tally.by_status[r.status_code] += 1
            tally.by_kind[case.kind] += 1
            if r.status_code >= 500:
                tally.server_errors.append(
                    {"n": case.n, "kind": case.kind, "path": case.path, "status": r.status_code,
                     "body": case.body[:200].decode(errors="replace"), "answer": r.text[:300]}
                )  # fmt: skip
    return tally
