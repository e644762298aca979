"""Continuation by token ids, with real processes: the gateway asks the engine for token ids
as the stream goes; when the engine is SIGKILLed mid-stream the next instance gets a
completions prompt of the prompt's ids plus the ids already sent (so its answer is exactly
what that instance says to that prompt), relayed into the client's chat or completions
stream; the client sees no token ids it did not ask for, and those it asked for once each;
an engine that gives no ids is continued by text, and the answer and the metrics say so.

Every engine here has the same seed: a prompt has one answer on either instance (the
simulator's text is a function of the prompt's token ids)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.fleet import MODEL, Fleet

HEALTH = {"interval_s": 0.2, "timeout_s": 0.3, "failure_threshold": 2, "success_threshold": 1}
SETTINGS = {"routing": {"policy": "round_robin"}, "health": HEALTH}
TOKENS = 200
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell the tale of the north gate"}],
    "max_tokens": TOKENS,
    "ignore_eos": True,
    "stream": True,
}

# a completions client that asked for token ids itself
COMPLETION_WITH_IDS = {
    "model": MODEL,
    "prompt": "The ballad of the river keep",
    "max_tokens": TOKENS,
    "ignore_eos": True,
    "stream": True,
    "return_token_ids": True,
}


def _events(raw: str) -> tuple[list[dict[str, Any]], list[str]]:
    chunks, comments = [], []
    for frame in raw.split("\n\n"):
        for line in frame.split("\n"):
            if line.startswith(":"):
                comments.append(line)
            elif line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert raw.endswith("data: [DONE]\n\n"), raw[-300:]
    return chunks, comments


def _cut(fleet: Fleet, path: str, body: dict[str, Any]) -> tuple[str, str]:
    """The client's whole stream, its engine SIGKILLed after five events; the survivor."""
    with (
        httpx.Client(base_url=fleet.base, timeout=60) as c,
        c.stream("POST", path, json=body) as s,
    ):
        assert s.status_code == 200
        victim = next(e for e in fleet.engines if e.id == s.headers["x-warmgate-instance"])
        survivor = next(e for e in fleet.engines if e is not victim)
        raw, killed = "", False
        for text in s.iter_text():
            raw += text
            if raw.count("data: ") >= 5 and not killed:
                assert victim.proc is not None
                os.killpg(victim.proc.proc.pid, signal.SIGKILL)
                killed = True
        assert killed
    return raw, survivor.url


def _sent_tokens(comments: list[str]) -> tuple[int, str]:
    (comment,) = [c for c in comments if "warmgate continued" in c]
    found = re.search(r"after (\d+) tokens .* by (token ids|text)$", comment)
    assert found is not None, comment
    return int(found.group(1)), found.group(2)


def _direct(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """An engine's own streamed answer, with token ids, asked directly."""
    with httpx.Client(timeout=60) as c, c.stream("POST", url + path, json=body) as s:
        assert s.status_code == 200
        raw = "".join(s.iter_text())
    return _events(raw)[0]


def _metric(fleet: Fleet, mode: str) -> str | None:
    text = httpx.get(f"{fleet.base}/metrics").text
    found = re.search(rf'^warmgate_continuation_total\{{mode="{mode}"\}} (\S+)$', text, re.M)
    return found.group(1) if found else None


def test_chat_continued_from_token_ids_hides_them(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, 2, time_scale=0.3, settings=SETTINGS, engine_args=("--seed", "5"))
    fleet.start()
    try:
        body = {**CHAT, "stream_options": {"include_usage": True}}
        raw, survivor = _cut(fleet, "/v1/chat/completions", body)
        assert '"token_ids":' not in raw  # asked by the gateway, never shown to this client
        assert '"prompt_token_ids":' not in raw
        chunks, comments = _events(raw)
        k, mode = _sent_tokens(comments)
        assert mode == "token ids" and 0 < k < TOKENS
        assert len({c["id"] for c in chunks}) == 1
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        finals = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
        assert len(finals) == 1
        assert finals[0]["warmgate"]["mode"] == "token_ids"
        assert [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        # what the uninterrupted answer began with (every engine has the seed) ...
        whole = _direct(survivor, "/v1/chat/completions", {**body, "return_token_ids": True})
        prompt_ids = whole[0]["prompt_token_ids"]
        steps = [c["choices"][0] for c in whole[1:] if c["choices"]]
        sent_ids = [t for s in steps[:k] for t in s["token_ids"]]
        head = "".join(s["delta"].get("content") or "" for s in steps[:k])
        # ... and what the survivor says after exactly those tokens
        tail = _direct(
            survivor,
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": prompt_ids + sent_ids,
                "max_tokens": TOKENS - k,
                "ignore_eos": True,
                "stream": True,
            },
        )
        assert text == head + "".join(c["choices"][0]["text"] for c in tail if c["choices"])
        usage = chunks[-1]["usage"]
        assert usage["prompt_tokens"] == len(prompt_ids)
        assert usage["completion_tokens"] == TOKENS
        assert _metric(fleet, "token_ids") == "1.0" and _metric(fleet, "text") is None
    finally:
        fleet.stop()


def test_completions_client_asking_for_ids_sees_them_once_each(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, 2, time_scale=0.3, settings=SETTINGS, engine_args=("--seed", "5"))
    fleet.start()
    try:
        body = COMPLETION_WITH_IDS
        raw, survivor = _cut(fleet, "/v1/completions", body)
        chunks, comments = _events(raw)
        k, mode = _sent_tokens(comments)
        assert mode == "token ids"
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        prompts = [ch["prompt_token_ids"] for ch in choices if "prompt_token_ids" in ch]
        ids = httpx.post(f"{survivor}/tokenize", json={"prompt": body["prompt"]}).json()
        assert prompts == [ids["tokens"]]  # the client's prompt, once; not the continuation's
        got = [t for ch in choices for t in ch["token_ids"]]
        assert len(got) == TOKENS
        tail = _direct(
            survivor,
            "/v1/completions",
            {**body, "prompt": ids["tokens"] + got[:k], "max_tokens": TOKENS - k},
        )
        assert got[k:] == [t for c in tail for t in c["choices"][0]["token_ids"]]
    finally:
        fleet.stop()


def test_engine_without_token_ids_is_continued_by_text_and_counted(tmp_path: Path) -> None:
    fleet = Fleet(
        tmp_path,
        2,
        time_scale=0.3,
        settings=SETTINGS,
        engine_args=("--seed", "5", "--token-ids", "ignored"),
    )
    fleet.start()
    try:
        raw, _ = _cut(fleet, "/v1/chat/completions", CHAT)
        chunks, comments = _events(raw)
        _, mode = _sent_tokens(comments)
        assert mode == "text"
        finals = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
        assert len(finals) == 1 and finals[0]["warmgate"]["mode"] == "text"
        assert '_ids":' not in raw
        assert _metric(fleet, "text") == "1.0" and _metric(fleet, "token_ids") is None
    finally:
        fleet.stop()


def _cuts(comments: list[str]) -> list[int]:
    """Tokens sent before each continuation, from the comments that announce them."""
    found = [re.search(r"after (\d+) tokens .* by token ids$", c) for c in comments]
    return [int(f.group(1)) for f in found if f is not None]


def test_a_stream_cut_again_with_nowhere_new_to_go_is_asked_again_where_it_stalled(
    tmp_path: Path,
) -> None:
    # the chaos run's second cut: the survivor of a SIGKILL, silent past stall_s (here
    # SIGSTOPped for twice that), is the only instance left; its health checks may fail
    # for longer than the stop without taking it out of the candidates
    health = {**HEALTH, "failure_threshold": 100}
    settings = {
        **SETTINGS,
        "health": health,
        "timeouts": {"stall_s": 1.0, "first_byte_s": 20.0},
    }
    fleet = Fleet(tmp_path, 2, time_scale=0.3, settings=settings, engine_args=("--seed", "5"))
    fleet.start()
    try:
        body = COMPLETION_WITH_IDS
        with (
            httpx.Client(base_url=fleet.base, timeout=60) as c,
            c.stream("POST", "/v1/completions", json=body) as s,
        ):
            first = next(e for e in fleet.engines if e.id == s.headers["x-warmgate-instance"])
            other = next(e for e in fleet.engines if e is not first)
            assert first.proc is not None and other.proc is not None
            raw, killed, stopped = "", False, False
            for text in s.iter_text():
                raw += text
                if raw.count("data: ") >= 5 and not killed:
                    os.killpg(first.proc.proc.pid, signal.SIGKILL)
                    killed = True
                if "warmgate continued" in raw and raw.count("data: ") >= 30 and not stopped:
                    os.killpg(other.proc.proc.pid, signal.SIGSTOP)
                    threading.Timer(2.0, os.killpg, (other.proc.proc.pid, signal.SIGCONT)).start()
                    stopped = True
        assert stopped
        assert '"error"' not in raw
        chunks, comments = _events(raw)
        k1, k2 = _cuts(comments)
        assert 0 < k1 < k2 < TOKENS
        where = [re.findall(r"continued on (\S+)", c) for c in comments]
        assert [w for found in where for w in found] == [other.id, other.id]
        choices = [ch["choices"][0] for ch in chunks if ch["choices"]]
        got = [t for ch in choices for t in ch["token_ids"]]
        assert len(got) == TOKENS
        prompt = httpx.post(f"{other.url}/tokenize", json={"prompt": body["prompt"]}).json()
        ids = prompt["tokens"]
        # each continuation is what the survivor says after exactly the tokens sent before it
        again = _direct(other.url, "/v1/completions", {**body, "prompt": ids + got[:k1]})
        assert got[k1:k2] == [t for c in again for t in c["choices"][0]["token_ids"]][: k2 - k1]
        tail = _direct(
            other.url,
            "/v1/completions",
            {**body, "prompt": ids + got[:k2], "max_tokens": TOKENS - k2},
        )
        assert got[k2:] == [t for c in tail for t in c["choices"][0]["token_ids"]]
    finally:
        for engine in fleet.engines:
            if engine.proc is not None and engine.proc.proc.poll() is None:
                os.killpg(engine.proc.proc.pid, signal.SIGCONT)
        fleet.stop()
