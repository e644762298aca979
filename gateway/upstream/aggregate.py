"""Assembling a streamed completion into the non-streaming response object.

The gateway streams from the engine even when the client did not ask for a stream, so it
sees the first token (TTFT feeds the router's cost model and releases the queued-prefill
count at the right moment) and can still fail over while nothing has reached the client.
Chunks are folded per choice index, in order:
- chat: `delta.role`, `content`, `reasoning_content` and `refusal` concatenated; tool calls
  merged by their `index` (id, type and function name set once, arguments concatenated);
  `logprobs.content` / `logprobs.refusal` lists concatenated;
- completions: `text` concatenated, `logprobs` lists (tokens, token_logprobs, top_logprobs,
  text_offset) concatenated;
- `finish_reason` (and vLLM's `stop_reason`) from the last chunk that sets it; `usage` from
  the chunk that carries it; other top-level fields from the first chunk that has them.
"""

from __future__ import annotations

from typing import Any, Literal

_TOP_LEVEL = ("id", "created", "model", "system_fingerprint", "service_tier")
_TEXT_FIELDS = ("content", "reasoning_content", "refusal")
_COMPLETION_LOGPROBS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class _Choice:
    __slots__ = ("finish_reason", "logprobs", "role", "stop_reason", "text", "tool_calls")

    def __init__(self) -> None:
        self.role: str | None = None
        self.text: dict[str, list[str]] = {}
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, list[Any]] | None = None
        self.finish_reason: Any = None
        self.stop_reason: Any = None


class StreamAggregator:
    """Folds `chat.completion.chunk` or `text_completion` chunks into one response."""

    def __init__(self, kind: Literal["chat", "completion"]) -> None:
        self.kind = kind
        self._top: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self.usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        for key in _TOP_LEVEL:
            if key not in self._top and chunk.get(key) is not None:
                self._top[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for raw in choices:
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", 0)
            choice = self._choices.setdefault(index if isinstance(index, int) else 0, _Choice())
            if raw.get("finish_reason") is not None:
                choice.finish_reason = raw["finish_reason"]
            if raw.get("stop_reason") is not None:
                choice.stop_reason = raw["stop_reason"]
            if self.kind == "chat":
                self._add_delta(choice, raw.get("delta"))
            elif isinstance(raw.get("text"), str):
                choice.text.setdefault("text", []).append(raw["text"])
            self._add_logprobs(choice, raw.get("logprobs"))

    @staticmethod
    def _add_delta(choice: _Choice, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("role"), str):
            choice.role = delta["role"]
        for name in _TEXT_FIELDS:
            if isinstance(delta.get(name), str):
                choice.text.setdefault(name, []).append(delta[name])
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            slot = choice.tool_calls.setdefault(
                call.get("index", len(choice.tool_calls)),
                {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
            )
            if call.get("id"):
                slot["id"] = call["id"]
            if call.get("type"):
                slot["type"] = call["type"]
            function = call.get("function")
            if isinstance(function, dict):
                if function.get("name"):
                    slot["function"]["name"] = function["name"]
                if isinstance(function.get("arguments"), str):
                    slot["function"]["arguments"] += function["arguments"]

    def _add_logprobs(self, choice: _Choice, logprobs: Any) -> None:
        if not isinstance(logprobs, dict):
            return
        keys = ("content", "refusal") if self.kind == "chat" else _COMPLETION_LOGPROBS
        merged = choice.logprobs if choice.logprobs is not None else {}
        for key in keys:
            if isinstance(logprobs.get(key), list):
                merged.setdefault(key, []).extend(logprobs[key])
        choice.logprobs = merged

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self._top.get("id", ""),
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self._top.get("created", 0),
            "model": self._top.get("model", ""),
        }
        out.update({k: v for k, v in self._top.items() if k not in out})
        out["choices"] = [self._choice(i, c) for i, c in sorted(self._choices.items())]
        if self.usage is not None:
            out["usage"] = self.usage
        return out

    def _choice(self, index: int, c: _Choice) -> dict[str, Any]:
        body: dict[str, Any] = {"index": index}
        if self.kind == "chat":
            message: dict[str, Any] = {
                "role": c.role or "assistant",
                "content": "".join(c.text["content"]) if "content" in c.text else None,
            }
            if "reasoning_content" in c.text:
                message["reasoning_content"] = "".join(c.text["reasoning_content"])
            if "refusal" in c.text:
                message["refusal"] = "".join(c.text["refusal"])
            if c.tool_calls:
                message["tool_calls"] = [c.tool_calls[k] for k in sorted(c.tool_calls)]
            body["message"] = message
        else:
            body["text"] = "".join(c.text.get("text", []))
        body["logprobs"] = c.logprobs
        body["finish_reason"] = c.finish_reason
        if c.stop_reason is not None:
            body["stop_reason"] = c.stop_reason
        return body
