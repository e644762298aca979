"""The contracts between warmgate's packages, owned here once and imported by router, tierd,
sim and gateway (this package imports nothing of ours):

- `contracts.tiers`: the names of the places KV lives (`Tier`: HBM, HOST, ARRAY, SNAPSHOT)
  and how the mediums of KV events (vLLM's `GPU`/`CPU`/`STORAGE`, tierd's) map onto them;
- `contracts.kv_events`: vLLM's KV event wire format (typed events, both msgpack encodings,
  ZMQ frames) that every publisher and consumer goes through;
- `contracts.redis_keys`: the shared-state key names and the residency event stream;
- `contracts.slices`: what names a KV slice (the slice-key rule).
"""
