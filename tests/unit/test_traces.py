"""Trace loaders: Mooncake JSONL round trip (extra session key kept), ordering, block-count
checks, clear errors on bad lines, and the Azure CSV as arrival offsets and lengths (and as
a replayable trace whose requests share no blocks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.traces import (
    TraceFormatError,
    TraceRequest,
    check_block_counts,
    iter_mooncake,
    load_azure_csv,
    load_mooncake,
    load_trace,
    write_mooncake,
)


def test_mooncake_round_trip_and_order(tmp_path: Path) -> None:
    reqs = [
        TraceRequest(1500.5, 1000, 20, (0, 1)),
        TraceRequest(0, 513, 7, (0, 2), session="player-1:npc-0-0"),
        TraceRequest(1500.5, 10, 1, (3,)),
    ]
    path = tmp_path / "t.jsonl"
    assert write_mooncake(path, reqs) == 3
    assert list(iter_mooncake(path)) == reqs  # file order, every field back
    loaded = load_mooncake(path)
    assert [r.timestamp_ms for r in loaded] == [0, 1500.5, 1500.5]
    assert loaded[1:] == [reqs[0], reqs[2]]  # stable for equal timestamps
    assert loaded[0].session == "player-1:npc-0-0"
    assert load_mooncake(path, limit=1) == [reqs[0]]
    assert '"timestamp": 0,' in path.read_text().splitlines()[1]


def test_reads_the_published_format(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 6758, "output_length": 500, '
        '"hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}\n\n'
        '{"timestamp": 27, "input_length": 512, "output_length": 3, "hash_ids": [0]}\n'
    )
    reqs = load_mooncake(path)
    assert len(reqs) == 2 and reqs[0].hash_ids[-1] == 13 and reqs[0].session is None
    assert check_block_counts(reqs, 512) == 0
    assert check_block_counts(reqs, 64) == 2


@pytest.mark.parametrize(
    "line",
    [
        '{"timestamp": 0, "input_length": 5}',
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["x"]}',
        '{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": []}',
        "not json",
    ],
)
def test_bad_lines_name_their_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n' + line + "\n"
    )
    with pytest.raises(TraceFormatError, match="line 2"):
        load_mooncake(path)


def test_azure_csv_gives_offsets_and_lengths(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:51.2224670,879,55\n"
    )
    rows = load_azure_csv(path)
    assert [r.input_length for r in rows] == [374, 396, 879]  # sorted by time
    assert rows[0].timestamp_ms == 0.0
    assert rows[1].timestamp_ms == pytest.approx(4314.579, abs=0.01)
    assert rows[2].output_length == 55
    assert len(load_azure_csv(path, limit=2)) == 2
    (tmp_path / "broken.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,2\n")
    with pytest.raises(TraceFormatError, match="line 2"):
        load_azure_csv(tmp_path / "broken.csv")


def test_an_azure_csv_replays_with_blocks_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.0000000,1024,9\n"
        "2023-11-16 18:15:48.5000000,1,3\n"
    )
    trace = load_trace(path, block_tokens=512)
    assert [len(r.hash_ids) for r in trace] == [1, 2, 1]
    ids = [h for r in trace for h in r.hash_ids]
    assert len(set(ids)) == len(ids)  # the trace says nothing is shared
    assert check_block_counts(trace, 512) == 0
    assert [r.output_length for r in trace] == [44, 9, 3]
    assert trace[1].timestamp_ms == pytest.approx(319.41, abs=0.01)
    assert len(load_trace(path, block_tokens=512, limit=2)) == 2
    with pytest.raises(ValueError, match="block_tokens"):
        load_trace(path, block_tokens=0)
    jsonl = tmp_path / "t.jsonl"  # anything else is Mooncake JSONL
    write_mooncake(jsonl, trace)
    assert load_trace(jsonl, block_tokens=512) == trace
