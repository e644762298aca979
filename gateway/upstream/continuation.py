"""Mid-stream continuation: an engine that fails after the client got its first bytes is
replaced by the next instance, asked to go on from the text already sent, as LiteLLM's and
Dynamo's continuations do. Completions: the prompt plus the text so far. Chat: the
messages plus an assistant message holding the text so far, with vLLM's
`continue_final_message` (and `add_generation_prompt: false`). `max_tokens` shrinks by the
pieces already sent.

The client sees one stream: the continuation's chunks get the first stream's `id` and
`created`, its role-only opening chunk is dropped, usage counts the whole answer, and an
SSE comment (`: warmgate continued ...`, ignored by SSE clients) plus a field
`warmgate.continued` on the chunk that finishes the choice say it happened.

Only single-choice, text-only streams are continued (no tool calls, no logprobs, `n` 1, a
string prompt); anything else ends with the error event as before. Nothing is decoded on
the happy path: the relayed frames are kept and read only when a continuation is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.json_codec import decode, encode
from gateway.pipeline.parse import ParsedRequest


@dataclass
class SoFar:
    """What the client has been sent of the answer."""

    text: str = ""
    pieces: int = 0  # content chunks: one token each from vLLM and the simulator
    id: str | None = None
    created: int | None = None
    finished: bool = False  # a finish_reason was sent: nothing left to continue
    continued_from: list[str] = field(default_factory=list)


def _frames_json(frames: list[bytes]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for frame in frames:
        for line in frame.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            try:
                value, _ = decode(payload)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def so_far(frames: list[bytes], kind: str) -> SoFar | None:
    """The answer sent so far, or None when it cannot be continued faithfully."""
    state = SoFar()
    for chunk in _frames_json(frames):
        state.id = state.id or chunk.get("id")
        state.created = state.created or chunk.get("created")
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            return None
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                return None
            if choice.get("logprobs"):
                return None
            if kind == "chat":
                delta = choice.get("delta") or {}
                if not isinstance(delta, dict) or delta.get("tool_calls"):
                    return None
                piece = delta.get("content") or ""
            else:
                piece = choice.get("text") or ""
            if not isinstance(piece, str):
                return None
            if piece:
                state.text += piece
                state.pieces += 1
            if choice.get("finish_reason"):
                state.finished = True
    return state


def continuation_body(parsed: ParsedRequest, sent: SoFar) -> dict[str, Any] | None:
    """The request that makes another engine go on from `sent`; None if none can."""
    body = dict(parsed.body)
    if body.get("n", 1) not in (1, None) or body.get("logprobs") or body.get("tools"):
        return None
    if parsed.kind == "chat":
        messages = list(body.get("messages") or [])
        messages.append({"role": "assistant", "content": sent.text})
        body["messages"] = messages
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        body["prompt"] = prompt + sent.text
        body.pop("echo", None)
    for name in ("max_completion_tokens", "max_tokens"):
        if isinstance(body.get(name), int):
            left = body[name] - sent.pieces
            if left < 1:
                return None
            body[name] = left
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


class Stitcher:
    """Rewrites a continuation's relayed frames into the first stream's."""

    def __init__(self, sent: SoFar, kind: str, instance: str) -> None:
        self.sent = sent
        self.kind = kind
        self.instance = instance

    def comment(self) -> bytes:
        return (
            f": warmgate continued on {self.instance} after {self.sent.pieces} pieces "
            f"(from {', '.join(self.sent.continued_from)})\n\n"
        ).encode()

    def __call__(self, frame: bytes) -> bytes:
        if not frame.startswith(b"data:"):
            return frame
        payload = frame[5:].strip()
        if payload == b"[DONE]":
            return frame
        try:
            chunk, fast = decode(payload)
        except ValueError:
            return frame
        if not isinstance(chunk, dict) or "error" in chunk:
            return frame
        if self.sent.id is not None:
            chunk["id"] = self.sent.id
        if self.sent.created is not None:
            chunk["created"] = self.sent.created
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    delta.pop("role", None)  # sent once already, by the first stream
                    if not delta and not choice.get("finish_reason"):
                        return b""  # the continuation's role-only opening chunk
                if choice.get("finish_reason"):
                    chunk["warmgate"] = {"continued": list(self.sent.continued_from)}
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            fix_usage(usage, self.sent.pieces)
        return b"data: " + encode(chunk, fast) + b"\n\n"


def fix_usage(usage: dict[str, Any], pieces: int) -> None:
    """The continuation's usage, as the whole answer's: its prompt held the text sent."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        usage["prompt_tokens"] = max(0, prompt - pieces)
        usage["completion_tokens"] = completion + pieces
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
