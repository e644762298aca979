"""Is a greedy answer continued from token ids (prefill of P+G[:k]) the same as decoding on?
One real vLLM engine; for a few prompts: the streamed answer's ids G, then completions with
P+G[:k] for several k, sequential (batch 1) and then all at once (batched)."""
import asyncio, json, sys, tempfile, time
from pathlib import Path
import httpx
from bench.real_fleet import RealFleet, RealFleetSpec, VLLM_BODY_EXTRA

N = 300
KS = [3, 10, 40, 120, 250]

async def stream(c, url, path, body):
    ids, text, prompt = [], "", None
    async with c.stream("POST", url + path, json=body) as r:
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
                    text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    return prompt, ids, text

def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))

async def main():
    fleet = RealFleet(RealFleetSpec(instances=1), Path(tempfile.mkdtemp(prefix="wg-diag-")))
    await fleet.start()
    url = next(iter(fleet.engines.values()))
    out = []
    try:
        async with httpx.AsyncClient(timeout=600) as c:
            prompts = [f"Player {i} asks the guard about the north gate and the storm {i*7}" for i in range(3)]
            for pi, p in enumerate(prompts):
                chat = {"model": fleet.model, "messages": [{"role": "user", "content": p}],
                        "max_tokens": N, "temperature": 0.0, "stream": True, "return_token_ids": True, **VLLM_BODY_EXTRA}
                P, G, T = await stream(c, url, "/v1/chat/completions", chat)
                ref = (await c.post(url + "/v1/chat/completions", json={**chat, "stream": False})).json()
                same_ref = ref["choices"][0]["message"]["content"] == T
                for batched in (False, True):
                    async def one(k):
                        body = {"model": fleet.model, "prompt": P + G[:k], "max_tokens": N - k, "temperature": 0.0,
                                "stream": True, "return_token_ids": True, **VLLM_BODY_EXTRA}
                        _, C, CT = await stream(c, url, "/v1/completions", body)
                        return k, first_diff(C, G[k:]), len(C)
                    if batched:
                        res = await asyncio.gather(*(one(k) for k in KS))
                    else:
                        res = [await one(k) for k in KS]
                    row = {"prompt": pi, "batched": batched, "ref_text_same": same_ref, "P": len(P), "G": len(G),
                           "by_k": {k: d for k, d, n in res}}
                    print(json.dumps(row), flush=True)
                    out.append(row)
    finally:
        await fleet.stop()
    Path("/tmp/chaos-f/diag.json").write_text(json.dumps(out, indent=1))

asyncio.run(main())
