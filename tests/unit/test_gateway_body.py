"""The body the gateway sends upstream: the client's exact bytes when nothing needs to
change, else the client's body with only `stream` / `stream_options` patched; and the JSON
codec's edges (NaN, integers beyond 64 bits) kept as the stdlib keeps them; lone surrogates
refused."""

from __future__ import annotations

import json

import pytest

from gateway.errors import OpenAIError
from gateway.json_codec import decode, decode_exact, encode
from gateway.pipeline.parse import ParsedRequest, decode_json_object, parse_chat, upstream_body

ODD = (
    b'{ "stream" : true,  "model":"m", "stream_options": {"include_usage": true},\n'
    b' "messages": [{"role": "user", "content": "caf\\u00e9 \xc3\xa9t\xc3\xa9"}],'
    b' "x_big": 123456789012345678901234567890, "x_unknown": {"k": [1, 2.50, null]} }  '
)


def parsed(raw: bytes) -> ParsedRequest:
    body, fast = decode_json_object(raw)
    return parse_chat(body, None, raw, fast)


def test_unchanged_body_is_forwarded_byte_for_byte() -> None:
    assert upstream_body(parsed(ODD), stream_upstream=True) == ODD
    plain = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1}'
    assert upstream_body(parsed(plain), stream_upstream=False) == plain


def test_stream_without_usage_gets_only_include_usage_added() -> None:
    raw = ODD.replace(b'"include_usage": true', b'"include_usage": false, "other": 1')
    sent = json.loads(upstream_body(parsed(raw), stream_upstream=True))
    want = json.loads(raw)
    want["stream_options"] = {"include_usage": True, "other": 1}
    assert sent == want
    assert sent["x_big"] == 123456789012345678901234567890  # exact, not a float


def test_non_stream_is_turned_into_a_stream_with_usage_when_stream_upstream() -> None:
    raw = b'{"model": "m", "stream": false, "messages": [{"role": "user", "content": "hi"}]}'
    sent = json.loads(upstream_body(parsed(raw), stream_upstream=True))
    assert sent == {**json.loads(raw), "stream": True, "stream_options": {"include_usage": True}}


def test_nan_is_re_encoded_as_the_stdlib_read_it() -> None:
    raw = (
        b'{"model": "m", "temperature": NaN, "stream": false,'
        b' "messages": [{"role": "user", "content": "caf\\u00e9"}]}'
    )
    sent = upstream_body(parsed(raw), stream_upstream=True)
    assert b"NaN" in sent
    assert json.loads(sent)["stream"] is True


def test_a_lone_surrogate_is_a_400_naming_its_field() -> None:
    # no encoder, hash or log line downstream can carry one (gateway/pipeline/json_guard.py)
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
    with pytest.raises(OpenAIError) as err:
        parsed(raw)
    assert err.value.status == 400
    assert err.value.param == "messages[0].content"


def test_a_body_built_without_raw_bytes_is_encoded() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    sent = upstream_body(parse_chat(body, None), stream_upstream=False)
    assert json.loads(sent) == body


def test_invalid_json_is_still_a_400() -> None:
    for raw in (b"{", b"[1]", b"   ", b"\xff"):
        with pytest.raises(OpenAIError) as err:
            decode_json_object(raw)
        assert err.value.status == 400


def test_codec_edges() -> None:
    assert decode(b'{"a": 1}') == ({"a": 1}, True)
    value, fast = decode(b'{"a": -Infinity}')
    assert value["a"] == float("-inf") and not fast
    assert encode(value, fast) == b'{"a":-Infinity}'
    assert decode_exact(b'{"a": 1.5}') == ({"a": 1.5}, True)
    assert encode({"big": 2**70}) == b'{"big":1180591620717411303424}'
    assert encode({"s": "é"}) == '{"s":"é"}'.encode()
    with pytest.raises(ValueError):
        decode(b"not json")
