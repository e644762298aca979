"""The Markdown report of `python -m bench.tierd_vllm` (bench/tierd_vllm.py): the lookup
round trip, cross-instance reuse, snapshot restore and the alternating dialogues, as tables."""

from __future__ import annotations

from typing import Any


def markdown(r: dict[str, Any]) -> str:
    rtt = r["lookup_rtt"]
    x, s = r["cross_instance"], r["snapshot_restore"]
    lines = [
        "| lookup (23 blocks) | p50 | p99 |",
        "|---|---|---|",
        *(f"| {k} | {v['p50_us']:.0f} µs | {v['p99_us']:.0f} µs |" for k, v in rtt.items()),
        "",
        f"Cross-instance reuse ({x['prompt_tokens']}-token prompts, medians of {len(x['rows'])}):",
        "",
        "| engine A cold | engine B from the array | engine B recompute | cached | moved "
        "| load time | ids = recompute |",
        "|---|---|---|---|---|---|---|",
        f"| {x['median_a_cold_ttft_s']:.3f} s | {x['median_b_from_array_ttft_s']:.3f} s | "
        f"{x['median_b_recompute_ttft_s']:.3f} s | {x['median_b_cached_tokens']:.0f} | "
        f"{x['median_bytes_loaded'] / 1e6:.1f} MB | {x['median_load_s'] * 1e3:.0f} ms | "
        f"{all(row['same_ids_as_recompute'] for row in x['rows'])} |",
        "",
        f"Snapshot restore ({s['prompt_tokens']}-token prompts, medians of {len(s['rows'])}):",
        "",
        "| from the snapshot | recompute | object | cached | ids = recompute |",
        "|---|---|---|---|---|",
        f"| {s['median_b_from_snapshot_ttft_s']:.3f} s | {s['median_b_recompute_ttft_s']:.3f} s | "
        f"{s['median_snapshot_object_bytes'] / 1e6:.1f} MB | {s['median_b_cached_tokens']:.0f} | "
        f"{all(row['same_ids_as_recompute'] for row in s['rows'])} |",
        "",
        "Dialogues alternating engines:",
        "",
        "| mode | dialogues per engine | requests | TTFT p50 | TTFT p90 | req/s | prompt tok/s "
        "| cached share |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {d['mode']} | {d['per_engine']} | {d['requests']} | {d['ttft_p50_s']:.3f} s | "
            f"{d['ttft_p90_s']:.3f} s | {d['requests_per_s']:.3f} | "
            f"{d['prompt_tokens_per_s']:.0f} | {d['cached_share']:.2f} |"
            for d in r["dialogues"]
        ),
    ]
    return "\n".join(lines) + "\n"
