"""tierd: the tier daemon beside each inference instance (L1 arena, L2 shared array, L3
snapshots), its native copy module, HTTP API, events and async client."""
