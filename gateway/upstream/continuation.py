"""Mid-stream continuation: an engine that fails after the client got its first bytes is
replaced by the next instance, asked to go on from what was already sent.

By token ids (`mode` "token_ids") when the engine reported them (the stream was sent with
`return_token_ids`, gateway/upstream/token_ids.py): the next instance gets a completions
request whose prompt is the prompt's ids plus the ids generated so far, so it goes on from
exactly the tokens the first engine had, not from a re-tokenized text (a word split across
two tokens can re-tokenize into one; greedy decoding then goes elsewhere). Its completions
chunks are rewritten into the client's format (chat deltas for a chat stream).

By text (`mode` "text") where the engine gave no ids, or the next instance refuses a
token-id prompt, as LiteLLM's and Dynamo's continuations do. Completions: the prompt plus
the text so far. Chat: the messages plus an assistant message holding the text so far,
with vLLM's `continue_final_message` (and `add_generation_prompt: false`).

`max_tokens` (and `min_tokens`) shrink by the tokens (text: the pieces) already sent. The
client sees one stream: the continuation's chunks get the first stream's `id` and
`created`, its role-only opening chunk and its prompt's ids are dropped, usage counts the
whole answer, and an SSE comment (`: warmgate continued ...`, ignored by SSE clients) plus a
field `warmgate` (`continued`: the instances that failed, `mode`) on the chunk that
finishes the choice say it happened.

Only single-choice, text-only streams are continued (no tool calls, no logprobs, `n` 1, a
string prompt); anything else ends with the error event as before. Nothing is decoded on
the happy path: the relayed frames are kept and read only when a continuation is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.json_codec import decode, encode
from gateway.pipeline.parse import ParsedRequest

TOKEN_IDS, TEXT = "token_ids", "text"  # how a stream was continued (metrics, `warmgate`)
COMPLETIONS_PATH = "/v1/completions"
# a chat body's fields a completions request has no use for (the rest passes as it is)
_CHAT_ONLY = frozenset(
    {
        "messages",
        "max_completion_tokens",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "continue_final_message",
        "add_generation_prompt",
        "chat_template",
        "chat_template_kwargs",
        "documents",
        "reasoning_effort",
        "include_reasoning",
        "modalities",
        "audio",
        "store",
        "metadata",
        "top_logprobs",
        "echo",
        "suffix",
    }
)


@dataclass
class SoFar:
    """What the client has been sent of the answer."""

    text: str = ""
    pieces: int = 0  # chunks with text: one token each from vLLM and the simulator
    id: str | None = None
    created: int | None = None
    finished: bool = False  # a finish_reason was sent: nothing left to continue
    continued_from: list[str] = field(default_factory=list)
    # of those, the ones it went silent on past `stall_s` (overloaded, stopped), not cut
    stalled_on: list[str] = field(default_factory=list)
    prompt_ids: list[int] | None = None  # the prompt's token ids, when the engine said
    token_ids: list[int] = field(default_factory=list)  # the ids generated so far
    ids_missing: bool = False  # a chunk with text came without its ids

    @property
    def has_ids(self) -> bool:
        """Every token sent is known by its id (and the prompt's are): continue by ids."""
        return self.prompt_ids is not None and not self.ids_missing

    @property
    def tokens(self) -> int:
        """Tokens already sent: counted exactly with ids, else one per chunk with text."""
        return len(self.token_ids) if self.has_ids else self.pieces


@dataclass(frozen=True)
class Continuation:
    """One way to ask the next instance for the rest: where, what, and how (`mode`)."""

    path: str
    body: dict[str, Any]
    mode: str
    kind: str  # the format of its chunks: "chat" or "completion"


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


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        return value
    return None


def so_far(frames: list[bytes], kind: str) -> SoFar | None:
    """The answer sent so far, or None when it cannot be continued faithfully."""
    state = SoFar()
    for chunk in _frames_json(frames):
        state.id = state.id or chunk.get("id")
        state.created = state.created or chunk.get("created")
        if state.prompt_ids is None:  # a chat stream's, at the top of its opening chunk
            state.prompt_ids = _ids(chunk.get("prompt_token_ids"))
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
                if state.prompt_ids is None:  # a completions stream's, in its first choice
                    state.prompt_ids = _ids(choice.get("prompt_token_ids"))
            if not isinstance(piece, str):
                return None
            ids = _ids(choice.get("token_ids"))
            if ids is not None:
                state.token_ids.extend(ids)
            elif piece:
                state.ids_missing = True
            if piece:
                state.text += piece
                state.pieces += 1
            if choice.get("finish_reason"):
                state.finished = True
    return state


def _refused(body: dict[str, Any]) -> bool:
    return body.get("n", 1) not in (1, None) or bool(body.get("logprobs") or body.get("tools"))


def _shrink(body: dict[str, Any], sent: int) -> bool:
    """Token budgets less what was sent; False when nothing is left to generate."""
    for name in ("max_completion_tokens", "max_tokens"):
        if isinstance(body.get(name), int):
            left = body[name] - sent
            if left < 1:
                return False
            body[name] = left
    if isinstance(body.get("min_tokens"), int):
        body["min_tokens"] = max(0, body["min_tokens"] - sent)
    return True


def by_token_ids(parsed: ParsedRequest, sent: SoFar) -> Continuation | None:
    """A completions request whose prompt is the prompt's ids and the ids sent so far."""
    if not sent.has_ids or sent.prompt_ids is None or _refused(parsed.body):
        return None
    body = {k: v for k, v in parsed.body.items() if k not in _CHAT_ONLY}
    if parsed.kind == "chat":
        # chat's budget (max_completion_tokens first); none: the engine's limit, not the
        # completions API's default of 16
        budget = parsed.body.get("max_completion_tokens", parsed.body.get("max_tokens"))
        body["max_tokens"] = budget if isinstance(budget, int) else None
    if not _shrink(body, len(sent.token_ids)):
        return None
    body["prompt"] = [*sent.prompt_ids, *sent.token_ids]
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    body["return_token_ids"] = True  # for the next continuation, if this one fails too
    return Continuation(COMPLETIONS_PATH, body, TOKEN_IDS, "completion")


def by_text(parsed: ParsedRequest, sent: SoFar, path: str) -> Continuation | None:
    """The client's own request, asked to go on from the text sent so far."""
    body = dict(parsed.body)
    if _refused(body):
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
    if not _shrink(body, sent.pieces):
        return None
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return Continuation(path, body, TEXT, parsed.kind)


def continuations(parsed: ParsedRequest, sent: SoFar, path: str) -> list[Continuation]:
    """The ways to go on from `sent`, best first: by token ids, then by text."""
    ways = (by_token_ids(parsed, sent), by_text(parsed, sent, path))
    return [way for way in ways if way is not None]


class Stitcher:
    """Rewrites a continuation's relayed frames into the first stream's: the client's
    format (`kind`) from the continuation's (`source`: "completion" when it went by token
    ids), the first stream's id, one prompt's ids, usage of the whole answer."""

    def __init__(
        self, sent: SoFar, kind: str, instance: str, mode: str = TEXT, source: str = ""
    ) -> None:
        self.sent = sent
        self.kind = kind
        self.instance = instance
        self.mode = mode
        self.source = source or kind

    def comment(self) -> bytes:
        return (
            f": warmgate continued on {self.instance} after {self.sent.tokens} tokens "
            f"(from {', '.join(self.sent.continued_from)}) by {self.mode.replace('_', ' ')}"
            "\n\n"
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
        chunk.pop("prompt_token_ids", None)  # the client had the prompt's ids once already
        to_chat = self.kind == "chat" and self.source != "chat"
        if to_chat:
            chunk["object"] = "chat.completion.chunk"
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                choice.pop("prompt_token_ids", None)
                if to_chat:
                    text = choice.pop("text", "")
                    choice["delta"] = {"content": text if isinstance(text, str) else ""}
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    delta.pop("role", None)  # sent once already, by the first stream
                    if not delta and not choice.get("finish_reason"):
                        return b""  # the continuation's role-only opening chunk
                if choice.get("finish_reason"):
                    chunk["warmgate"] = {
                        "continued": list(self.sent.continued_from),
                        "mode": self.mode,
                    }
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            fix_usage(usage, self.sent.tokens)
        return b"data: " + encode(chunk, fast) + b"\n\n"


def fix_usage(usage: dict[str, Any], pieces: int) -> None:
    """The continuation's usage, as the whole answer's: its prompt held the tokens sent."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        usage["prompt_tokens"] = max(0, prompt - pieces)
        usage["completion_tokens"] = completion + pieces
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
