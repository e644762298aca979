"""The repository stands alone: no tracked file points outside the checkout at the team's
shared folder, and the traces the benchmarks read are committed, byte for byte as their
README (bench/data/traces/README.md) says."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "bench" / "data" / "traces"
# spelt in pieces so that this file does not name what it looks for
OUTSIDE = tuple(f"{where}/shared".encode() for where in ("..", "/work"))
# a row of the README's table: | `file` | bytes | `sha256` |
ROW = re.compile(r"^\| `([^`/]+)` \| ([\d,]+) \| `([0-9a-f]{64})` \|$", re.MULTILINE)
NOT_TRACES = {"README.md", ".gitattributes", "LICENSE-Apache-2.0.txt", "LICENSE-CC-BY-4.0.md"}


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def _listed() -> dict[str, tuple[int, str]]:
    text = (TRACES / "README.md").read_text(encoding="utf-8")
    return {m[1]: (int(m[2].replace(",", "")), m[3]) for m in ROW.finditer(text)}


def test_no_tracked_file_or_doc_points_at_the_shared_folder() -> None:
    tracked = _tracked()
    assert len(tracked) > 100  # the checkout's files, not an empty listing
    offenders = []
    for path in tracked:
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        data = path.read_bytes()
        offenders += [f"{path.relative_to(ROOT)}: {o.decode()}" for o in OUTSIDE if o in data]
    assert offenders == []


def test_the_readme_lists_both_traces_and_their_licences_are_there() -> None:
    assert set(_listed()) == {"mooncake_conversation.jsonl", "azure_conv_2023.csv"}
    for notice in ("LICENSE-Apache-2.0.txt", "LICENSE-CC-BY-4.0.md"):
        assert (TRACES / notice).stat().st_size > 0, notice


def test_every_trace_matches_its_readme() -> None:
    listed = _listed()
    present = {p.name for p in TRACES.iterdir()} - NOT_TRACES
    assert present == set(listed)  # nothing committed beside them that the README omits
    for name, (size, sha256) in listed.items():
        data = (TRACES / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (size, sha256), name


def test_the_traces_are_tracked_by_git() -> None:
    tracked = set(_tracked())
    for name in _listed():
        assert TRACES / name in tracked, name
