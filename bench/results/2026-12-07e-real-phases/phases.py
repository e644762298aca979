"""Scratch (2026-12-07): the phases of instrument.sh's JSON lines: python phases.py FILE."""

import json
import statistics as st
import sys

with open(sys.argv[1]) as f:
    rows = [json.loads(line) for line in f]
print("rows", len(rows))
seq = [
    "read",
    "decoded",
    "parse_only",
    "parsed",
    "tok_start",
    "rendered",
    "encoded",
    "hashed",
    "rr",
    "bound",
    "routed",
    "decided",
    "posting",
    "head",
    "relay_first",
    "w2",
    "w3",
]


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


prev = "start"
for k in seq:
    d = [
        r[k] - (r[prev] if prev != "start" else 0)
        for r in rows
        if k in r and (prev == "start" or prev in r)
    ]
    if d:
        stats = f"mean {st.mean(d):7.3f} p50 {q(d, 0.5):7.3f} p90 {q(d, 0.9):7.3f}"
        print(f"{prev:>12} -> {k:<12} n={len(d):4d} {stats}")
    if d:
        prev = k
pre = [r["posting"] for r in rows if "posting" in r]
print(f"start->posting mean {st.mean(pre):.3f} p50 {q(pre, 0.5):.3f} p90 {q(pre, 0.9):.3f}")
cpu = [(r["cpu_posting"] - r["cpu0"]) * 1000 for r in rows if "cpu_posting" in r]
print(
    "main-thread cpu start->posting (incl. others' interleaved)",
    f"mean {st.mean(cpu):.3f} p50 {q(cpu, 0.5):.3f}",
)
print("bytes w2 p50", q([r["b2"] for r in rows], 0.5), "w3", q([r["b3"] for r in rows], 0.5))
