"""Server-sent events from an engine, relayed event by event (never buffered whole).

Bytes arrive in arbitrary pieces; `SseRelay.feed()` cuts them into complete events (frames end
with a blank line), inspects each `data:` payload and returns what to pass on:
- the first chunk carrying a token (text, content, reasoning or tool calls, even an empty
  one: a special token prints nothing) marks TTFT;
- the usage of the stream (the chunk with `usage`, normally the last) is remembered;
- when the client did not ask for usage (we forced `include_usage` upstream) the usage-only
  chunk is dropped and `"usage": null` keys are removed, so the client sees what it asked for;
- an `error` payload from the engine is remembered (and passed on);
- `data: [DONE]` marks a clean end; a chunk with a `finish_reason` marks that the engine
  finished its answer (`finished`: what the engine sent decides whether a stream completed,
  not whether the client or the engine closed first).
Events that need no change are passed on as the exact bytes received.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.json_codec import decode, encode

_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')  # a string value, not null


@dataclass
class SseRelay:
    """Incremental SSE inspector/rewriter for one upstream stream."""

    strip_usage: bool
    on_chunk: Callable[[dict[str, Any]], None] | None = None  # sees every JSON chunk
    # the part of a payload decoded to read it, less what the relay never reads (a
    # continuable stream's token ids: thousands of prompt ids in its opening chunk); None:
    # the whole payload
    for_reading: Callable[[bytes], bytes] | None = None
    saw_content: bool = False
    saw_done: bool = False
    saw_finish: bool = False  # a choice ended (finish_reason set)
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    events: int = 0
    # every chunk decoded was read by orjson (no NaN/Infinity): what was built from them
    # may be encoded by orjson too (gateway/json_codec.py)
    fast: bool = True
    _buffer: bytes = field(default=b"", repr=False)
    _cr: bool = field(default=False, repr=False)  # the last piece ended in a held-back CR

    def feed(self, data: bytes) -> list[bytes]:
        """Complete events found so far (each ending with a blank line), to send on.

        Line endings are LF, CRLF or CR (SSE allows all three) and are relayed as LF. A CR
        that ends a piece is held back until the next one says whether an LF follows it, so
        a CRLF split across reads is still one line ending."""
        if self._cr:
            data, self._cr = b"\r" + data, False
        if data.endswith(b"\r"):
            data, self._cr = data[:-1], True
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self._buffer += data
        out: list[bytes] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return out
            frame, self._buffer = self._buffer[: end + 2], self._buffer[end + 2 :]
            relayed = self._event(frame)
            if relayed:
                out.append(relayed)

    @property
    def finished(self) -> bool:
        """The engine sent the whole answer (its [DONE], or a finish_reason), without error."""
        return self.error is None and (self.saw_done or self.saw_finish)

    def flush(self) -> bytes:
        """Whatever trailing bytes never formed a complete event (an upstream cut short)."""
        out = b"".join(self.feed(b"\n")) if self._cr else b""  # a held CR ends its line
        rest, self._buffer = self._buffer.rstrip(b"\n"), b""
        return out + (self._event(rest + b"\n\n") if rest.strip() else b"")

    def _event(self, frame: bytes) -> bytes:
        payload = _payload(frame)
        if payload is None:
            return frame  # comments, keep-alives, other fields: pass as they are
        self.events += 1
        if payload.strip() == b"[DONE]":
            self.saw_done = True
            return frame
        # read the opening chunks less what is never read (they carry the prompt's ids)
        read = payload
        if self.for_reading is not None and not self.saw_content:
            read = self.for_reading(payload)
        if not self.saw_finish and _FINISHED.search(read):
            self.saw_finish = True
        if (
            self.on_chunk is None
            and self.saw_content
            and b'"usage"' not in read
            and b'"error"' not in read
        ):
            return frame  # fast path: nothing left to learn from or strip in this chunk
        try:
            chunk, fast = decode(read)
        except ValueError:
            return frame
        if not isinstance(chunk, dict):
            return frame
        self.fast = self.fast and fast
        if isinstance(chunk.get("error"), dict):
            self.error = chunk["error"]
            return frame
        if not self.saw_content and has_token(chunk):
            self.saw_content = True
        if self.on_chunk is not None:
            self.on_chunk(chunk)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if not self.strip_usage or "usage" not in chunk:
            return frame
        if usage is not None and not chunk.get("choices"):
            return b""  # the usage-only chunk the client did not ask for
        if read is not payload:  # written again whole: what the reading left out included
            try:
                chunk, fast = decode(payload)
            except ValueError:
                return frame
        del chunk["usage"]
        return b"data: " + encode(chunk, fast) + b"\n\n"


def _payload(frame: bytes) -> bytes | None:
    """The data of an event (its `data:` lines joined), None when it has none."""
    if frame.startswith(b"data:") and frame.find(b"\n") == len(frame) - 2:
        return frame[5:-2].lstrip(b" ")  # one data line, as engines write them
    lines = [line[5:].lstrip(b" ") for line in frame.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def has_token(chunk: dict[str, Any]) -> bool:
    """The chunk carries a generated token, even one whose text is empty (a special token
    the engine does not print): a completion choice with `text`, or a chat delta that is
    not the opening role-only delta. TTFT is when the first token came, not the first
    visible character."""
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if "text" in choice or choice.get("finish_reason"):
            return True
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            continue
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
            return True
        if "role" not in delta and ("content" in delta or "reasoning_content" in delta):
            return True
    return False


def cached_tokens(usage: dict[str, Any] | None) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens`, when the engine reported it."""
    if not usage:
        return None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        value = details.get("cached_tokens")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def prompt_tokens(usage: dict[str, Any] | None) -> int | None:
    if not usage:
        return None
    value = usage.get("prompt_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
