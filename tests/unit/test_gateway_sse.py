"""The gateway's SSE relay: events cut correctly from arbitrary byte pieces, TTFT marked at
the first content chunk, usage kept and (when the client did not ask) stripped, errors and
`[DONE]` noticed, untouched events passed on byte for byte."""

from __future__ import annotations

import json

from gateway.upstream.sse import SseRelay, cached_tokens
from gateway.upstream.token_ids import strip

CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": None},
    {"choices": [{"index": 0, "delta": {"content": "Hail"}}], "usage": None},
    {"choices": [{"index": 0, "delta": {"content": ", traveller"}}], "usage": None},
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 50,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 32},
        },
    },
]
STREAM = (
    b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in CHUNKS) + b"data: [DONE]\n\n"
)


def relay_in_pieces(relay: SseRelay, data: bytes, size: int) -> tuple[bytes, list[bool]]:
    out = b""
    content_seen: list[bool] = []
    for i in range(0, len(data), size):
        out += b"".join(relay.feed(data[i : i + size]))
        content_seen.append(relay.saw_content)
    return out + relay.flush(), content_seen


def test_passthrough_when_client_asked_for_usage_at_any_piece_size() -> None:
    for size in (1, 3, 7, 64, len(STREAM)):
        relay = SseRelay(strip_usage=False)
        out, _ = relay_in_pieces(relay, STREAM, size)
        assert out == STREAM
        assert relay.saw_done and relay.saw_content and relay.error is None
        assert cached_tokens(relay.usage) == 32


def test_usage_stripped_when_client_did_not_ask() -> None:
    relay = SseRelay(strip_usage=True)
    out, _ = relay_in_pieces(relay, STREAM, 5)
    frames = [f for f in out.decode().split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(f[len("data: ") :]) for f in frames[:-1]]
    assert len(chunks) == 3
    assert all("usage" not in c for c in chunks)
    assert relay.usage is not None and relay.usage["prompt_tokens"] == 50  # still measured


def test_first_content_is_the_first_non_empty_delta() -> None:
    relay = SseRelay(strip_usage=False)
    first = b"data: " + json.dumps(CHUNKS[0]).encode() + b"\n\n"
    relay.feed(first)
    assert not relay.saw_content  # the role-only chunk carries no content
    relay.feed(b"data: " + json.dumps(CHUNKS[1]).encode()[:10])
    assert not relay.saw_content  # incomplete event
    relay.feed(json.dumps(CHUNKS[1]).encode()[10:] + b"\n\n")
    assert relay.saw_content


def test_completions_text_counts_as_content_and_crlf_frames_are_read() -> None:
    relay = SseRelay(strip_usage=False)
    relay.feed(b'data: {"choices":[{"index":0,"text":" Once"}]}\r\n\r\n')
    assert relay.saw_content and relay.events == 1


def test_error_event_and_truncation_are_noticed() -> None:
    relay = SseRelay(strip_usage=False)
    out = relay.feed(b'data: {"error":{"message":"boom","type":"server_error"}}\n\n')
    assert out and relay.error == {"message": "boom", "type": "server_error"}
    assert not relay.saw_done
    cut = SseRelay(strip_usage=False)
    cut.feed(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\ndata: {"cho')
    assert cut.flush() == b'data: {"cho\n\n'  # what arrived is passed on; no [DONE] seen
    assert not cut.saw_done


def test_comments_and_non_json_pass_unchanged() -> None:
    relay = SseRelay(strip_usage=True)
    data = b": keep-alive\n\nevent: ping\ndata: hello\n\n"
    assert b"".join(relay.feed(data)) == data


def _events(relay: SseRelay, pieces: list[bytes]) -> bytes:
    return b"".join(b"".join(relay.feed(p)) for p in pieces) + relay.flush()


def test_every_split_point_of_lf_crlf_and_cr_streams_keeps_every_event() -> None:
    """A line ending split across reads (`…}\\r\\n\\r` then `\\n data: …usage…`) must not
    merge two events: at every split point of an LF, a CRLF and a CR-only stream (all three
    are SSE line endings), and byte by byte, the relay sees the same five events, keeps the
    usage and relays the LF form of the stream."""
    for eol in (b"\n", b"\r\n", b"\r"):
        stream = STREAM.replace(b"\n", eol)
        cuts = [[stream[:i], stream[i:]] for i in range(len(stream) + 1)]
        cuts.append([stream[i : i + 1] for i in range(len(stream))])
        for pieces in cuts:
            relay = SseRelay(strip_usage=False)
            out = _events(relay, pieces)
            where = (eol, [len(p) for p in pieces][:2])
            assert out == STREAM, where
            assert relay.events == 5 and relay.saw_done, where
            assert cached_tokens(relay.usage) == 32, where


def test_a_stream_cut_after_a_carriage_return_flushes_its_last_event() -> None:
    relay = SseRelay(strip_usage=False)
    out = _events(relay, [b'data: {"choices":[{"index":0,"text":"x"}]}\r'])
    assert out == b'data: {"choices":[{"index":0,"text":"x"}]}\n\n' and relay.saw_content


def test_opening_chunks_are_read_less_their_ids_and_relayed_whole() -> None:
    """A continuable stream's opening chunk carries the prompt's ids: the relay reads it
    without them (`for_reading`) and relays it as it came; a chunk it writes again (usage
    taken out) keeps them."""
    ids = list(range(3000))
    opening = {
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        "prompt_token_ids": ids,
    }
    token = {
        "choices": [{"index": 0, "delta": {"content": "Hail"}, "token_ids": [5]}],
        "usage": {"prompt_tokens": 3000, "completion_tokens": 1},  # continuous usage
        "prompt_token_ids": ids,
    }
    opening_frame = b"data: " + json.dumps(opening, separators=(",", ":")).encode() + b"\n\n"
    token_frame = b"data: " + json.dumps(token, separators=(",", ":")).encode() + b"\n\n"
    read: list[int] = []

    def for_reading(payload: bytes) -> bytes:
        read.append(len(payload))
        return strip(payload)

    relay = SseRelay(strip_usage=True, for_reading=for_reading)
    assert relay.feed(opening_frame) == [opening_frame]
    assert not relay.saw_content and read
    (out,) = relay.feed(token_frame)
    assert relay.saw_content and relay.usage == token["usage"]
    assert json.loads(out[6:]) == {"choices": token["choices"], "prompt_token_ids": ids}
    calls = len(read)
    relay.feed(token_frame)  # after the first token: nothing to learn by cutting
    assert len(read) == calls
