"""The three tiers, one file each: L1 arena (`l1_arena`), L2 array directory (`l2_array`),
L3 compressed snapshots (`l3_snapshots`). They hold bytes and answer what they hold; the
policies (what goes where, when) live in `tierd.store`."""
