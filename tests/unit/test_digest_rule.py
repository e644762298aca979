"""The digest -> u64 rule (a block digest's low 64 bits, big-endian) is written once, in
`contracts.slices.normalize`; the KV event codec and precise mode use it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from contracts.kv_events import normalize_hash
from contracts.slices import HASH_MASK, normalize
from router.precise import event_int

REPO = Path(__file__).resolve().parents[2]
RULE = re.compile(r"from_bytes\([^)]*[\"']big[\"'][^)]*\)\s*&")


def test_the_rule_is_written_once() -> None:
    where = []
    for pkg in ("contracts", "gateway", "router", "tierd", "sim", "bench"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            if RULE.search(path.read_text()):
                where.append(path.relative_to(REPO).as_posix())
    assert where == ["contracts/slices.py"]


def test_every_user_gives_the_same_int() -> None:
    digest = hashlib.sha256(b"block").digest()
    expected = int.from_bytes(digest[-8:], "big")
    assert normalize(digest) == normalize_hash(digest) == event_int(digest) == expected
    assert normalize_hash(bytearray(digest)) == expected
    assert normalize_hash(-1) == normalize(-1) == HASH_MASK
    assert event_int is normalize
