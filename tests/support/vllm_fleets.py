"""Real vLLM fleets for the test session, at most one alive at a time (2 engines).

An engine takes ~3.3 GB and a core, and ~45 s to start, so the suite starts each kind of
fleet once and never holds two kinds together: asking for another kind stops the current
one first. Test modules that share a kind should sit together (pytest runs files in order).
`session_fleets` (tests/conftest.py) is the one holder; its fixtures hand out the fleets.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class Stoppable(Protocol):
    def stop(self) -> None: ...


class FleetSlot:
    """Holds the one live fleet and the kind it was built for."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.fleet: Any = None
        self.run_dir: Path | None = None
        self.error: BaseException | None = None

    def get(self, kind: str, build: Callable[[Path], Stoppable]) -> Any:
        """The fleet of this kind, stopping another kind's first; a build that failed once
        fails again at once (the log is in the first error) instead of costing minutes."""
        if self.kind == kind:
            if self.error is not None:
                raise RuntimeError(f"fleet {kind!r} failed to start earlier") from self.error
            return self.fleet
        self.release()
        # short path: ipc:// socket paths must fit in sun_path (107 bytes)
        self.run_dir = Path(tempfile.mkdtemp(prefix="wg-f-"))
        self.kind = kind
        try:
            fleet = build(self.run_dir)
            fleet_start = getattr(fleet, "start", None)
            if fleet_start is not None:
                fleet_start()
        except BaseException as exc:
            self.error = exc
            raise
        self.fleet = fleet
        return fleet

    def release(self) -> None:
        if self.fleet is not None:
            with contextlib.suppress(Exception):
                self.fleet.stop()
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        self.kind, self.fleet, self.run_dir, self.error = None, None, None, None
