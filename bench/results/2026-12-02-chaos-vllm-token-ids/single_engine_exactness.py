"""Is a greedy answer continued from token ids (prefill of P+G[:k]) the same as decoding on?

One real vLLM engine; for a few prompts: the streamed answer's ids G, then completions with
P+G[:k] for several k, sequential (batch 1) and then all at once (batched). Prints one JSON
row per prompt and mode; with a path argument, writes them all there too.
Run from the repository root: `.venv/bin/python bench/results/2026-12-02-chaos-vllm-token-ids/single_engine_exactness.py [out.json]`.
"""  # noqa: E501

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.real_fleet import VLLM_BODY_EXTRA, RealFleet, RealFleetSpec

N = 300
KS = [3, 10, 40, 120, 250]


async def stream(
    c: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[list[int], list[int], str]:
    """The prompt's ids, the generated ids and the text of one streamed answer."""
    ids: list[int] = []
    text = ""
    prompt: list[int] | None = None
    async with c.stream("POST", url, json=body) as r:
        r.raise_for_status()
        buf = ""
        async for t in r.aiter_text():
            buf += t
            *frames, buf = buf.split("\n\n")
            for f in frames:
                if not f.startswith("data: ") or f == "data: [DONE]":
                    continue
                ch = json.loads(f[6:])
                prompt = prompt or ch.get("prompt_token_ids")
                for choice in ch.get("choices") or []:
                    prompt = prompt or choice.get("prompt_token_ids")
                    ids += choice.get("token_ids") or []
                    delta = (choice.get("delta") or {}).get("content")
                    text += delta or choice.get("text") or ""
    return prompt or [], ids, text


def first_diff(a: list[int], b: list[int]) -> int | None:
    """The first position where a and b differ (None when they are equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


async def continued(
    c: httpx.AsyncClient, base: str, model: str, p: list[int], g: list[int], k: int
) -> tuple[int, int | None]:
    body = {
        "model": model,
        "prompt": p + g[:k],
        "max_tokens": N - k,
        "temperature": 0.0,
        "stream": True,
        "return_token_ids": True,
        **VLLM_BODY_EXTRA,
    }
    _, ids, _ = await stream(c, f"{base}/v1/completions", body)
    return k, first_diff(ids, g[k:])


async def main(out_path: Path | None) -> None:
    fleet = RealFleet(RealFleetSpec(instances=1), Path(tempfile.mkdtemp(prefix="wg-diag-")))
    await fleet.start()
    base = next(iter(fleet.engines.values()))
    rows: list[dict[str, Any]] = []
    try:
        async with httpx.AsyncClient(timeout=600) as c:
            for pi in range(3):
                prompt = f"Player {pi} asks the guard about the north gate and the storm {pi * 7}"
                chat = {
                    "model": fleet.model,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": N,
                    "temperature": 0.0,
                    "stream": True,
                    "return_token_ids": True,
                    **VLLM_BODY_EXTRA,
                }
                p, g, text = await stream(c, f"{base}/v1/chat/completions", chat)
                ref = await c.post(f"{base}/v1/chat/completions", json={**chat, "stream": False})
                same_ref = ref.json()["choices"][0]["message"]["content"] == text
                for batched in (False, True):
                    if batched:
                        res = await asyncio.gather(
                            *(continued(c, base, fleet.model, p, g, k) for k in KS)
                        )
                    else:
                        res = [await continued(c, base, fleet.model, p, g, k) for k in KS]
                    row = {
                        "prompt": pi,
                        "batched": batched,
                        "ref_text_same": same_ref,
                        "P": len(p),
                        "G": len(g),
                        "by_k": dict(res),
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        await fleet.stop()
    if out_path is not None:
        await asyncio.to_thread(out_path.write_text, json.dumps(rows, indent=1))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
