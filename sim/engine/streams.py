"""How the outputs of a request's sequences become an HTTP response.

A request has one sequence per choice: one for chat, one per prompt for a batched
completions request (choice i answers prompt i, as in vLLM). `sse_frames` merges their
step outputs as they come into SSE chunks carrying each choice's `index`; `collect` waits
for all of them for a plain response. `AbortingStream` aborts the sequences however the
streamed response ends (finished, client gone, even before the first frame, or cancelled),
which frees their batch slots and KV blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sim.engine.openai_api import SSE_DONE, ResponseShape, sse, usage
from sim.engine.sequence import Sequence as Seq
from sim.engine.sequence import StepOutput


def total_usage(seqs: Sequence[Seq]) -> dict[str, Any]:
    return usage(
        sum(s.prompt_len for s in seqs),
        sum(len(s.output_ids) for s in seqs),
        sum(s.num_cached for s in seqs),
    )


class AbortingStream(StreamingResponse):
    """A streamed response that calls `on_close` however it ends."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None], **kw: Any):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _outputs(seqs: Sequence[Seq]) -> AsyncIterator[tuple[int, StepOutput]]:
    """(choice index, output) pairs in the order they are produced, until all finish."""
    if len(seqs) == 1:  # the common case needs no merging
        while True:
            out = await seqs[0].queue.get()
            yield 0, out
            if out.finish_reason is not None:
                return
    merged: asyncio.Queue[tuple[int, StepOutput]] = asyncio.Queue()

    async def pump(i: int, seq: Seq) -> None:
        while True:
            out = await seq.queue.get()
            merged.put_nowait((i, out))
            if out.finish_reason is not None:
                return

    pumps = [asyncio.create_task(pump(i, s)) for i, s in enumerate(seqs)]
    try:
        remaining = len(seqs)
        while remaining:
            i, out = await merged.get()
            if out.finish_reason is not None:
                remaining -= 1
            yield i, out
    finally:
        for t in pumps:
            t.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def sse_frames(
    seqs: Sequence[Seq], shape: ResponseShape, include_usage: bool, token_ids: bool = False
) -> AsyncIterator[bytes]:
    """The SSE frames of a streamed response. With `token_ids` (the request's
    `return_token_ids`), as vLLM: every step's chunk carries the ids it generated, even one
    whose text is held back, and the prompt's ids come once per choice."""
    started: set[int] = set()
    async for i, out in _outputs(seqs):
        prompt_ids = seqs[i].prompt_ids if token_ids and i not in started else None
        if shape.chat and i not in started:
            opening = shape.chunk(
                "",
                None,
                index=i,
                first=True,
                with_usage_field=include_usage,
                prompt_token_ids=prompt_ids,
            )
            yield sse(opening)
            prompt_ids = None
        started.add(i)
        if out.text or out.finish_reason is not None or token_ids:
            chunk = shape.chunk(
                out.text,
                out.finish_reason,
                index=i,
                with_usage_field=include_usage,
                token_ids=out.token_ids if token_ids else None,
                prompt_token_ids=prompt_ids,
            )
            yield sse(chunk)
    if include_usage:
        yield sse(shape.usage_chunk(total_usage(seqs)))
    yield SSE_DONE


async def collect(seqs: Sequence[Seq]) -> list[tuple[str, str | None]]:
    """Each choice's whole text and finish reason."""
    texts: list[list[str]] = [[] for _ in seqs]
    reasons: list[str | None] = [None] * len(seqs)
    async for i, out in _outputs(seqs):
        texts[i].append(out.text)
        if out.finish_reason is not None:
            reasons[i] = out.finish_reason
    return [("".join(t), r) for t, r in zip(texts, reasons, strict=True)]
