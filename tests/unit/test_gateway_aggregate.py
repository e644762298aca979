"""Assembling streamed chunks into the non-streaming response a client asked for."""

from __future__ import annotations

from gateway.upstream.aggregate import StreamAggregator


def chat_chunk(delta: dict, index: int = 0, finish: str | None = None, **extra: object) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish, **extra}],
    }


def test_chat_text_tool_calls_logprobs_and_usage() -> None:
    agg = StreamAggregator("chat")
    agg.add(chat_chunk({"role": "assistant", "content": ""}))
    agg.add(
        chat_chunk({"content": "Hail"}, logprobs={"content": [{"token": "Hail", "logprob": -0.1}]})
    )
    agg.add(
        chat_chunk({"content": ", friend"}, logprobs={"content": [{"token": ",", "logprob": -0.2}]})
    )
    agg.add(
        chat_chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "give_quest", "arguments": '{"q'},
                    }
                ]
            }
        )
    )
    agg.add(chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '": 3}'}}]}))
    agg.add(chat_chunk({}, finish="tool_calls"))
    agg.add(
        {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}
    )
    out = agg.result()
    assert out["object"] == "chat.completion" and out["id"] == "chatcmpl-1" and out["created"] == 7
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "Hail, friend"
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "give_quest", "arguments": '{"q": 3}'},
        }
    ]
    assert [t["token"] for t in choice["logprobs"]["content"]] == ["Hail", ","]
    assert out["usage"] == {"prompt_tokens": 9, "completion_tokens": 4}


def test_chat_several_choices_keep_their_own_text() -> None:
    agg = StreamAggregator("chat")
    for i, word in [(0, "a"), (1, "x"), (0, "b"), (1, "y")]:
        agg.add(chat_chunk({"content": word}, index=i))
    agg.add(chat_chunk({}, index=1, finish="stop", stop_reason=None))
    out = agg.result()
    assert [c["message"]["content"] for c in out["choices"]] == ["ab", "xy"]
    assert [c["finish_reason"] for c in out["choices"]] == [None, "stop"]
    assert "usage" not in out  # none was streamed


def test_completion_text_and_logprobs() -> None:
    agg = StreamAggregator("completion")
    for text, lp in [(" Once", -0.5), (" upon", -0.25)]:
        agg.add(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "text": text, "finish_reason": None,
                             "logprobs": {"tokens": [text], "token_logprobs": [lp]}}],
            }
        )  # fmt: skip
    agg.add({"id": "cmpl-1", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    out = agg.result()
    assert out["object"] == "text_completion"
    (choice,) = out["choices"]
    assert choice["text"] == " Once upon" and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {"tokens": [" Once", " upon"], "token_logprobs": [-0.5, -0.25]}
