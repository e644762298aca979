"""The pieces of continuation by token ids, on bytes and dicts: asking the engine for the
ids, hiding them from a client that did not ask, reading what was sent, the completions
request that goes on from it, and a completions continuation rewritten into chat chunks."""

from __future__ import annotations

import json
from typing import Any

from gateway.pipeline.parse import parse_chat, parse_completion
from gateway.upstream.continuation import (
    COMPLETIONS_PATH,
    TEXT,
    TOKEN_IDS,
    Stitcher,
    continuations,
    so_far,
)
from gateway.upstream.token_ids import _IDS, ask, strip

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_ask_adds_the_field_once() -> None:
    parsed = parse_chat(dict(CHAT), None)
    body = json.dumps(CHAT).encode() + b" \n"
    assert json.loads(ask(parsed, body)) == {**CHAT, "return_token_ids": True}
    mine = parse_chat({**CHAT, "return_token_ids": True}, None)
    assert ask(mine, b"{}") == b"{}"  # the client asked: its body as it is
    off = {**CHAT, "return_token_ids": False}
    asked = ask(parse_chat(dict(off), None), json.dumps(off).encode())
    assert asked.count(b"return_token_ids") == 1 and json.loads(asked)["return_token_ids"]


def test_strip_removes_the_ids_and_nothing_else() -> None:
    # vLLM's chat opening chunk (prompt ids at the top), a token chunk, a completions one
    opening = (
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
        b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
        b'"prompt_token_ids":[1, 2,3]}\n\n'
    )
    assert json.loads(strip(opening)[6:]) == {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    token = b'data: {"choices":[{"index":0,"text":"a","token_ids":[7]}]}\n\n'
    assert strip(token) == b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
    first = b'data: {"choices":[{"prompt_token_ids":[1],"token_ids":[7],"text":"b"}]}\n\n'
    assert strip(first) == b'data: {"choices":[{"text":"b"}]}\n\n'
    # the same words inside a string stay: a quote there is always escaped
    quoted = sse({"choices": [{"text": 'say ,"token_ids":[1] and "prompt_token_ids": [2]'}]})
    assert strip(quoted) == quoted
    assert strip(b": comment\n\n") == b": comment\n\n"


def test_strip_cuts_compact_ids_as_the_pattern_would() -> None:
    """vLLM's compact members are cut by `find`; anything else is left to the pattern, and
    both give the same bytes."""
    prompt = ",".join(str(i) for i in range(5000))
    frames = [
        b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        b'"finish_reason":null}],"prompt_token_ids":[' + prompt.encode() + b"]}\n\n",
        b'data: {"choices":[{"token_ids":[7]}]}\n\n',  # the only member
        b'data: {"choices":[{"index":0,"text":"a","token_ids":[]}]}\n\n',
        b'data: {"choices":[{"index":0,"text":"a","token_ids":[7]},'
        b'{"index":1,"text":"b","token_ids":[8,9]}]}\n\n',
        b'data: {"choices":[{"index":0,"text":"a", "token_ids": [7, 8]}]}\n\n',  # spaced
        b'data: {"choices":[{"text":"x","token_ids":[1,"]"]}]}\n\n',  # not ids: kept
        sse({"choices": [{"text": 'a ,"token_ids":[1]', "token_ids": [4]}]}),
    ]
    for frame in frames:
        assert strip(frame) == _IDS.sub(b"", frame), frame[:80]
    assert b"token_ids" not in strip(frames[0]) and len(strip(frames[0])) < 200
    assert strip(frames[5]) == frames[5]
    assert json.loads(strip(frames[6])[6:]) == {"choices": [{"text": 'a ,"token_ids":[1]'}]}


def test_so_far_reads_the_ids_and_continues_by_them() -> None:
    parsed = parse_chat({**CHAT, "max_tokens": 10, "temperature": 0}, None)
    frames = [
        sse({"id": "x", "choices": [{"delta": {"role": "assistant"}}], "prompt_token_ids": [5]}),
        sse({"id": "x", "choices": [{"delta": {"content": "Ab"}, "token_ids": [8]}]}),
        sse({"id": "x", "choices": [{"delta": {"content": ""}, "token_ids": [9]}]}),
    ]
    sent = so_far(frames, "chat")
    assert sent is not None and sent.has_ids
    assert (sent.prompt_ids, sent.token_ids, sent.text, sent.tokens) == ([5], [8, 9], "Ab", 2)
    ids, text = continuations(parsed, sent, "/v1/chat/completions")
    assert (ids.mode, ids.path, text.mode) == (TOKEN_IDS, COMPLETIONS_PATH, TEXT)
    assert ids.body["prompt"] == [5, 8, 9] and ids.body["max_tokens"] == 8
    assert "messages" not in ids.body and ids.body["temperature"] == 0
    assert text.body["max_tokens"] == 9  # by text: one token a chunk with text
    # a chunk with text and no ids: only the text way is left
    bare = so_far([*frames, sse({"choices": [{"delta": {"content": "c"}}]})], "chat")
    assert bare is not None and not bare.has_ids
    assert [w.mode for w in continuations(parsed, bare, "/v1/chat/completions")] == [TEXT]


def test_chat_without_a_budget_gets_the_engines_limit_not_16() -> None:
    sent = so_far(
        [sse({"choices": [{"prompt_token_ids": [1], "text": "a", "token_ids": [2]}]})], "completion"
    )
    assert sent is not None
    chat = continuations(parse_chat(dict(CHAT), None), sent, "/v1/chat/completions")
    assert chat[0].body["max_tokens"] is None
    plain = parse_completion({"model": "m", "prompt": "p", "stream": True}, None)
    assert "max_tokens" not in continuations(plain, sent, "/v1/completions")[0].body


def test_a_completions_continuation_becomes_chat_chunks() -> None:
    sent = so_far([sse({"id": "x", "created": 1, "choices": [], "prompt_token_ids": [5]})], "chat")
    assert sent is not None
    sent.continued_from = ["a"]
    stitch = Stitcher(sent, "chat", "b", TOKEN_IDS, "completion")
    out = stitch(
        sse(
            {
                "id": "y",
                "object": "text_completion",
                "created": 2,
                "choices": [
                    {"index": 0, "text": "go", "prompt_token_ids": [5, 8], "token_ids": [3]}
                ],
            }
        )
    )
    chunk = json.loads(out[6:])
    assert chunk["id"] == "x" and chunk["created"] == 1
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"] == [{"index": 0, "delta": {"content": "go"}, "token_ids": [3]}]
    end = json.loads(
        stitch(sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}))[6:]
    )
    assert end["warmgate"] == {"continued": ["a"], "mode": TOKEN_IDS}
    assert b"by token ids" in stitch.comment()
