"""Plain-text tables of the admin API's answers, for `warmgate admin` (no dependency: fixed
columns, widths from the content)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) or "-"
    if isinstance(value, Mapping):
        return " ".join(f"{k}={_cell(v)}" for k, v in value.items()) or "-"
    return str(value)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.extend(_flatten(value, name + "."))
        else:
            out.append((name, value))
    return out


_WALL_KEYS = ("since", "last_check", "scraped_at", "written_at")


def _wall(key: str, value: Any) -> Any:
    """Unix times (the admin API's `since`, `last_check`, ...) as UTC clock times."""
    if key.rsplit(".", 1)[-1] in _WALL_KEYS and isinstance(value, int | float) and value > 1e9:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))
    return value


def kv_table(data: Any) -> str:
    """Any JSON object as `key  value` lines, nested keys joined by dots."""
    if not isinstance(data, Mapping):
        return _cell(data)
    return table(["key", "value"], [(k, _wall(k, v)) for k, v in _flatten(data)])


def instances_table(data: Any) -> str:
    rows = []
    for inst in data.get("instances", []):
        health = inst.get("health") or {}
        fleet = inst.get("fleet") or {}
        engine = inst.get("engine") or {}
        rows.append(
            [
                inst.get("id"),
                health.get("state"),
                fleet.get("status"),
                inst.get("in_flight"),
                inst.get("queued_prefill_tokens"),
                engine.get("kv_cache_usage"),
                inst.get("cached_tokens_believed"),
                inst.get("models"),
                health.get("reason"),
            ]
        )
    headers = ["id", "health", "fleet", "in_flight", "queued_tok", "kv_use", "cached_tok"]
    return table([*headers, "models", "why"], rows)


def explain_tables(data: Any) -> str:
    req, dec = data.get("request", {}), data.get("decision", {})
    head = (
        f"request: {req.get('model')} session={req.get('session_key')} "
        f"prompt_tokens={req.get('prompt_tokens')} blocks={req.get('blocks')} "
        f"({req.get('mode')}, {req.get('block_tokens')} tokens per block)\n"
        f"decision: {dec.get('instance')} by {dec.get('policy')}: {dec.get('reason')}\n"
        f"  predicted TTFT {_cell(dec.get('predicted_ttft_s'))} s, cached "
        f"{_cell(dec.get('cached_tokens_by_tier'))}, fallbacks {_cell(dec.get('fallbacks'))}"
    )
    cands = data.get("candidates", [])
    part_names: list[str] = []
    term_names: list[str] = []
    for c in cands:
        for k in c.get("parts", {}):
            if k not in part_names:
                part_names.append(k)
        for k in c.get("score_terms", {}):
            if k not in term_names and k != "predicted_ttft_s":
                term_names.append(k)
    rows = [
        [
            ("* " if c.get("instance") == dec.get("instance") else "  ") + str(c.get("instance")),
            c.get("in_flight"),
            c.get("cached_tokens_by_tier"),
            c.get("predicted_ttft_s"),
            *(c.get("parts", {}).get(k) for k in part_names),
            *(c.get("score_terms", {}).get(k) for k in term_names),
        ]
        for c in cands
    ]
    headers = ["instance", "in_flight", "cached", "ttft_s", *part_names, *term_names]
    out = [head, "", table(headers, rows)]
    excluded = data.get("excluded") or {}
    if excluded:
        out.append("")
        out.append(
            table(
                ["excluded", "state", "why"],
                [[k, v.get("state"), v.get("reason")] for k, v in excluded.items()],
            )
        )
    return "\n".join(out)


def fleet_table(data: Any) -> str:
    records = data.get("records", {})
    draining = data.get("draining", {})
    rows = [
        [
            iid,
            r.get("status"),
            r.get("by"),
            r.get("spec", {}).get("url"),
            draining.get(iid, {}).get("in_flight"),
        ]
        for iid, r in records.items()
    ]
    store = f"{data.get('backend')} store, replica {data.get('replica')}"
    head = f"fleet ({store}): {_cell(data.get('instances'))}"
    return head + "\n\n" + table(["id", "status", "by", "url", "in_flight"], rows)
