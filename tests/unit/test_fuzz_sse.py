"""Property test of the SSE relay, which reads bytes from engines: any stream of events
(data chunks, comments, [DONE]), written with LF or CRLF line ends, cut into pieces at any
points, gives the same events, the same usage and the same [DONE] as when fed whole; every
single cut point of a fixed stream and byte-by-byte feeding too."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.upstream.sse import SseRelay

text = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
chunk = st.fixed_dictionaries(
    {
        "choices": st.lists(
            st.fixed_dictionaries(
                {"index": st.just(0), "delta": st.fixed_dictionaries({"content": text})}
            ),
            max_size=2,
        )
    },
    optional={
        "usage": st.none()
        | st.fixed_dictionaries(
            {"prompt_tokens": st.integers(0, 99), "completion_tokens": st.integers(0, 99)}
        )
    },
)
event = st.one_of(
    chunk.map(lambda c: ("data", json.dumps(c))),
    text.map(lambda t: ("comment", t)),
)


def serialize(events: list[tuple[str, str]], eol: str, done: bool) -> bytes:
    out = []
    for kind, payload in events:
        line = f"data: {payload}" if kind == "data" else f":{payload}"
        out.append(line + eol + eol)
    if done:
        out.append("data: [DONE]" + eol + eol)
    return "".join(out).encode()


def run(data: bytes, cuts: list[int]) -> tuple[list[bytes], dict[str, Any] | None, bool]:
    relay = SseRelay(strip_usage=False)
    frames: list[bytes] = []
    last = 0
    for c in sorted(set(cuts)):
        frames += relay.feed(data[last:c])
        last = c
    frames += relay.feed(data[last:])
    tail = relay.flush()
    if tail:
        frames.append(tail)
    return [f.replace(b"\r\n", b"\n") for f in frames], relay.usage, relay.saw_done


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(event, max_size=8),
    st.sampled_from(["\n", "\r\n"]),
    st.booleans(),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_sse_any_cuts_give_the_events_of_the_whole(
    events: list[tuple[str, str]], eol: str, done: bool, cuts: list[int]
) -> None:
    data = serialize(events, eol, done)
    whole = run(data, [])
    assert run(data, [c % (len(data) + 1) for c in cuts]) == whole
    assert whole[2] == done
    assert len([f for f in whole[0] if f.startswith(b"data: {")]) == len(
        [e for e in events if e[0] == "data"]
    )


def test_sse_every_single_cut_and_byte_by_byte_lf_and_crlf() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    for eol in ("\n", "\r\n"):
        events = [
            ("data", json.dumps({"choices": [{"index": 0, "delta": {"content": "Hail"}}]})),
            ("comment", " keep-alive"),
            ("data", json.dumps({"choices": [], "usage": usage})),
        ]
        data = serialize(events, eol, True)
        whole = run(data, [])
        assert whole[1] == usage and whole[2]
        for cut in range(len(data) + 1):
            assert run(data, [cut]) == whole, (eol, cut)
        assert run(data, list(range(len(data)))) == whole
