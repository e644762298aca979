"""Request traces: the Mooncake JSONL format (read and write) and the Azure LLM inference
CSV (arrivals and lengths only).

Mooncake format, one JSON object a line:
`{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`.
`hash_ids` are chained prefix-block ids: id k at position i names "this block and every
block before it", so two requests sharing their first j ids share their first
j * block_tokens tokens; `len(hash_ids) == ceil(input_length / block_tokens)` (the last
block may be partial). Optional extra keys (for example `session`) are kept.

What a game server tells the gateway (issue 22) rides on optional keys, written only when
set, so older traces read as before and plain ones are unchanged:
- `warm_lead_ms`, `warm_tokens`, `warm_blocks`: the request is a dialogue's first line, its
  context (the prompt less the line) warmed this long before; the warm's prompt has
  `warm_tokens` tokens and its full blocks are the first `warm_blocks` of `hash_ids`;
- `priority`: the request's class (`interactive`, `normal`, `background`);
- `world_version` (`zone:version`), `world_blocks`: the first prompt of a zone's new world
  version; the version's world state is the first `world_blocks` blocks.

The Azure CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`) carries no prefix identity: it
is loaded as arrival offsets and lengths for arrival-process and length studies, and
`load_trace` turns it into Mooncake records whose blocks no two requests share (all the
trace can say), so the cluster simulator compares load balancing on its real arrivals.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from contracts.errors import InputError
from router.blocks import BlockSizeError


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a Mooncake-format trace."""

    timestamp_ms: float  # arrival, milliseconds from the start of the trace
    input_length: int  # prompt tokens
    output_length: int  # generated tokens
    hash_ids: tuple[int, ...]  # chained prefix-block ids
    session: str | None = None  # session key when the trace knows it (game traces)
    # the game server's hints (module docstring); None: not said
    warm_lead_ms: float | None = None
    warm_tokens: int | None = None
    warm_blocks: int | None = None
    priority: str | None = None
    world_version: str | None = None
    world_blocks: int | None = None

    def to_json(self) -> str:
        obj: dict[str, object] = {
            "timestamp": _compact_number(self.timestamp_ms),
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
        }
        if self.session is not None:
            obj["session"] = self.session
        for key in _HINT_KEYS:
            value = getattr(self, key)
            if value is not None:
                obj[key] = _compact_number(value) if key == "warm_lead_ms" else value
        return json.dumps(obj)


# optional keys and how each is read (TraceRequest's fields of the same names)
_HINT_KEYS: dict[str, type] = {
    "warm_lead_ms": float,
    "warm_tokens": int,
    "warm_blocks": int,
    "priority": str,
    "world_version": str,
    "world_blocks": int,
}


@dataclass(frozen=True, slots=True)
class LengthRequest:
    """One request of a trace without prefix identity (Azure)."""

    timestamp_ms: float
    input_length: int
    output_length: int


class TraceFormatError(InputError, ValueError):
    """A line that is not a valid trace record; carries the line number."""


def _compact_number(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(x, 3)


def parse_mooncake_line(line: str, lineno: int = 0) -> TraceRequest:
    try:
        obj = json.loads(line)
        hash_ids = tuple(int(h) for h in obj["hash_ids"])
        req = TraceRequest(
            timestamp_ms=float(obj["timestamp"]),
            input_length=int(obj["input_length"]),
            output_length=int(obj["output_length"]),
            hash_ids=hash_ids,
            session=str(obj["session"]) if obj.get("session") is not None else None,
            **{k: read(obj[k]) for k, read in _HINT_KEYS.items() if obj.get(k) is not None},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"line {lineno}: not a Mooncake trace record: {exc}") from exc
    if req.input_length < 0 or req.output_length < 0 or req.timestamp_ms < 0:
        raise TraceFormatError(f"line {lineno}: negative length or timestamp")
    if (req.warm_lead_ms or 0) < 0 or (req.warm_blocks or 0) > len(req.hash_ids):
        raise TraceFormatError(f"line {lineno}: warm lead < 0 or more warm blocks than hash_ids")
    if (req.world_blocks or 0) > len(req.hash_ids):
        raise TraceFormatError(f"line {lineno}: more world blocks than hash_ids")
    return req


def iter_mooncake(path: str | Path) -> Iterator[TraceRequest]:
    """Records of a Mooncake-format file, in file order; blank lines skipped."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                yield parse_mooncake_line(line, lineno)


def load_mooncake(path: str | Path, *, limit: int | None = None) -> list[TraceRequest]:
    """All records (or the first `limit`), sorted by timestamp (stable for equal times)."""
    out: list[TraceRequest] = []
    for req in iter_mooncake(path):
        out.append(req)
        if limit is not None and len(out) >= limit:
            break
    out.sort(key=lambda r: r.timestamp_ms)
    return out


def write_mooncake(path: str | Path, requests: Iterable[TraceRequest]) -> int:
    """Write records one a line; returns how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for req in requests:
            fh.write(req.to_json())
            fh.write("\n")
            n += 1
    return n


def check_block_counts(requests: Iterable[TraceRequest], block_tokens: int) -> int:
    """Count records whose hash_ids length differs from ceil(input_length / block_tokens)."""
    bad = 0
    for r in requests:
        if len(r.hash_ids) != -(-r.input_length // block_tokens):
            bad += 1
    return bad


def _parse_azure_time(text: str) -> datetime:
    # "2023-11-16 18:15:46.6805900": seven fractional digits, more than %f accepts.
    date_part, _, frac = text.strip().partition(".")
    base = datetime.strptime(date_part, "%Y-%m-%d %H:%M:%S")
    micros = int((frac + "000000")[:6]) if frac else 0
    return base.replace(microsecond=micros)


def load_azure_csv(path: str | Path, *, limit: int | None = None) -> list[LengthRequest]:
    """Azure LLM inference trace rows as arrival offsets (ms from the first row) and lengths."""
    rows: list[tuple[datetime, int, int]] = []
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        for lineno, row in enumerate(reader, 2):
            try:
                rows.append(
                    (
                        _parse_azure_time(row["TIMESTAMP"]),
                        int(row["ContextTokens"]),
                        int(row["GeneratedTokens"]),
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise TraceFormatError(f"line {lineno}: not an Azure trace row: {exc}") from exc
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        return []
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [
        LengthRequest(
            timestamp_ms=(t - t0).total_seconds() * 1000.0, input_length=i, output_length=o
        )
        for t, i, o in rows
    ]


def unshared_blocks(requests: Iterable[LengthRequest], block_tokens: int) -> list[TraceRequest]:
    """Mooncake records for a trace without prefix identity: each request gets its own
    `ceil(input_length / block_tokens)` fresh block ids, so nothing counts as shared."""
    if block_tokens <= 0:
        raise BlockSizeError("block_tokens must be positive")
    out: list[TraceRequest] = []
    next_id = 0
    for r in requests:
        blocks = -(-r.input_length // block_tokens)
        out.append(
            TraceRequest(
                timestamp_ms=r.timestamp_ms,
                input_length=r.input_length,
                output_length=r.output_length,
                hash_ids=tuple(range(next_id, next_id + blocks)),
            )
        )
        next_id += blocks
    return out


def load_trace(
    path: str | Path, *, block_tokens: int, limit: int | None = None
) -> list[TraceRequest]:
    """A trace for the cluster simulator: an Azure CSV (`.csv`, with `unshared_blocks`) or a
    Mooncake-format JSONL file (anything else)."""
    if Path(path).suffix.lower() == ".csv":
        return unshared_blocks(load_azure_csv(path, limit=limit), block_tokens)
    return load_mooncake(path, limit=limit)
