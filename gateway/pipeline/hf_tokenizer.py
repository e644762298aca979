"""A local tokenizer for precise mode: the engines' own Hugging Face tokenizer files, read by
the gateway, so routing a request costs no `/tokenize` round trip to an engine.

`routing.precise.tokenizer_dir` names the directory the engines load their tokenizer from
(what vLLM's `--tokenizer`, or its model path, names): `tokenizer.json`, and the chat
template from `chat_template.jinja` or `tokenizer_config.json`. It does what vLLM does
with a request (vllm/entrypoints: the chat template rendered by transformers'
`apply_chat_template`, then tokenized):

- chat: the template rendered in a sandboxed Jinja environment (`trim_blocks`,
  `lstrip_blocks`, the `tojson` filter, `raise_exception`, `strftime_now`, the special
  tokens as variables), with `messages`, `tools` and `add_generation_prompt`; the text
  encoded without special tokens (the template writes them). Message content is a string or
  a list of text parts (joined with newlines, as vLLM does for string-content templates);
  anything else (images, audio) raises `LocalTokenizeUnsupported`, and the gateway asks an
  engine's `/tokenize` instead.
- completion: the prompt encoded with the tokenizer's special tokens (its post-processor).

A chat prompt is encoded a message at a time, and the messages seen before are not encoded
again (`pipeline.token_segments`: exact, bounded by `segment_cache_tokens`). Long texts are
encoded in a worker thread, off the event loop. Needs the `tokenizer` extra
(`pip install 'warmgate[tokenizer]'`: tokenizers, jinja2); nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from contracts.errors import ConfigurationError, RoutingError
from gateway.pipeline.token_segments import SegmentCache, cut_pattern

T = TypeVar("T")
THREAD_THRESHOLD_CHARS = 8192  # encode longer texts in a worker thread
SPECIAL_TOKEN_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip


def available() -> bool:
    """Whether the tokenizer extra is installed (tokenizers and jinja2 import)."""
    return all(importlib.util.find_spec(m) is not None for m in ("tokenizers", "jinja2"))


class TokenizerExtraMissing(ConfigurationError, RuntimeError):
    """`routing.precise.tokenizer_dir` is set but the tokenizer extra is not installed."""


class TokenizerDirError(ConfigurationError, ValueError):
    """`routing.precise.tokenizer_dir` holds no tokenizer."""


class LocalTokenizeUnsupported(RoutingError, ValueError):
    """This request's shape is not one the local tokenizer reproduces exactly."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _chat_template(directory: Path, config: Mapping[str, Any]) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # named templates: the default one
        for entry in template:
            if isinstance(entry, Mapping) and entry.get("name") == "default":
                return str(entry["template"])
    return None


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise LocalTokenizeUnsupported(f"message content part of type {kind!r}")
            texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise LocalTokenizeUnsupported(f"message content of type {type(content).__name__}")


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise LocalTokenizeUnsupported("messages must be a list of objects")
    return [{**m, "content": _content_text(m.get("content"))} for m in messages]


class HfChatTokenizer:
    """A `router.precise.Tokenizer`: the tokenize payload (`tokens.tokenize_payload`)
    in, the token ids an engine with the same tokenizer files computes out."""

    def __init__(self, directory: str | Path, *, segment_cache_tokens: int = 0) -> None:
        try:
            import jinja2.sandbox
            from tokenizers import Tokenizer
        except ImportError as exc:  # an optional extra
            raise TokenizerExtraMissing(
                "routing.precise.tokenizer_dir needs the tokenizer extra: "
                "pip install 'warmgate[tokenizer]'"
            ) from exc
        path = Path(directory)
        if not (path / "tokenizer.json").is_file():
            raise TokenizerDirError(f"routing.precise.tokenizer_dir: no tokenizer.json in {path}")
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text("utf-8")) if config_file.is_file() else {}
        self._tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self._specials = {
            key: text for key in SPECIAL_TOKEN_KEYS if (text := _token_text(config.get(key)))
        }
        template = _chat_template(path, config)
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(template) if template is not None else None
        pattern = cut_pattern(
            {
                "content": t.content,
                "normalized": t.normalized,
                "single_word": t.single_word,
                "lstrip": t.lstrip,
            }
            for t in self._tokenizer.get_added_tokens_decoder().values()
        )
        self.segments = (
            SegmentCache(pattern, segment_cache_tokens)
            if pattern is not None and segment_cache_tokens > 0
            else None
        )

    def render(self, payload: Mapping[str, Any]) -> str:
        """The chat prompt text the engine's template makes of a chat payload."""
        if self._template is None:
            raise LocalTokenizeUnsupported("the tokenizer has no chat template")
        tools = payload.get("tools") or None
        return self._template.render(
            messages=_messages(payload.get("messages")),
            tools=tools,
            add_generation_prompt=bool(payload.get("add_generation_prompt", True)),
            **self._specials,
        )

    def _encode(self, text: str, special: bool) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=special).ids
        return ids

    def _encode_pieces(self, texts: Sequence[str]) -> dict[str, list[int]]:
        return {text: self._encode(text, False) for text in texts}

    async def _encode_chat(self, text: str) -> Sequence[int]:
        """A rendered chat prompt's ids, its pieces seen before taken from the cache."""
        if self.segments is None:
            return await _off_loop_if_long(len(text), self._encode, text, False)
        parts, known, missing = self.segments.split(text)
        encoded = await _off_loop_if_long(sum(map(len, missing)), self._encode_pieces, missing)
        return self.segments.join(parts, known, encoded)

    async def __call__(self, payload: Mapping[str, Any]) -> Sequence[int]:
        if "messages" in payload:
            return await self._encode_chat(self.render(payload))
        if isinstance(payload.get("prompt"), str):
            text = str(payload["prompt"])
        else:
            raise LocalTokenizeUnsupported("neither messages nor a text prompt")
        # a completion prompt is encoded whole: the tokenizer's post-processor adds its
        # special tokens around the whole text
        return await _off_loop_if_long(len(text), self._encode, text, True)


async def _off_loop_if_long(chars: int, encode: Callable[..., T], *args: Any) -> T:
    """`encode(*args)`, in a worker thread when it encodes more than the threshold's text."""
    if chars > THREAD_THRESHOLD_CHARS:
        return await asyncio.to_thread(encode, *args)
    return encode(*args)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' filter (Jinja's own would escape HTML): plain json.dumps, no ASCII escapes
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise LocalTokenizeUnsupported(f"the chat template refused the request: {message}")
