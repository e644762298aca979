"""Scratch: the gateway's tokenizing steps on a game workload's prompts, one process.

python tokbench.py SEED
"""

import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
from bench.workloads import game_items
from gateway.launch.models import ensure_tiny_model
from gateway.pipeline.hf_tokenizer import HfChatTokenizer
from router.precise import VllmBlockHasher

tok = HfChatTokenizer(ensure_tiny_model(), segment_cache_tokens=1_000_000)
h = VllmBlockHasher(hash_seed="0", block_size=128)
items = game_items(16, 1.5, int(sys.argv[1]) if len(sys.argv) > 1 else 173, "cpu")
T: dict[str, list[float]] = {
    k: [] for k in ("render", "split", "encode", "join", "hash", "ntok", "nmiss")
}
segments = tok.segments
assert segments is not None  # the tiny model's tokenizer cuts at its added tokens
for it in items:
    payload = {"messages": it.messages}
    t0 = time.perf_counter()
    text = tok.render(payload)
    t1 = time.perf_counter()
    parts, known, missing = segments.split(text)
    t2 = time.perf_counter()
    enc = tok._encode_pieces(missing)
    t3 = time.perf_counter()
    ids = segments.join(parts, known, enc)
    t4 = time.perf_counter()
    hs = h.block_hashes(ids)
    t5 = time.perf_counter()
    for k, a, b in (
        ("render", t0, t1),
        ("split", t1, t2),
        ("encode", t2, t3),
        ("join", t3, t4),
        ("hash", t4, t5),
    ):
        T[k].append((b - a) * 1000)
    T["ntok"].append(len(ids))
    T["nmiss"].append(sum(map(len, missing)))
for k, v in T.items():
    print(f"{k:7s} mean {st.mean(v):8.3f} p50 {st.median(v):8.3f} max {max(v):8.3f}")
