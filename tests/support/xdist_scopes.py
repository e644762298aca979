"""How `pytest -n 2` splits the suite over two xdist workers (tests/conftest.py).

Every module is one unit of work (its module-scoped fixtures start once), and every module
that runs real vLLM engines is one unit together, on one worker: the machine holds two
engines at a time, and the session's fleet slot (tests/support/vllm_fleets.py) keeps a kind
of fleet up only while its modules run back to back.

The controller schedules by node id alone (it collects nothing), so it tells a real-engine
module by its source: the module-level mark `pytest.mark.fleet(kind)` or
`pytest.mark.engines`, the same marks the workers sort by. (xdist's own `loadgroup` cannot
group here: it renames items through an attribute pytest 9 no longer reads.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

REAL_ENGINE_GROUP = "real-vllm"
REAL_ENGINE_MARKS = ("pytest.mark.fleet(", "pytest.mark.engines")


def runs_real_engines(source: str) -> bool:
    return any(mark in source for mark in REAL_ENGINE_MARKS)


class ModuleScopes(LoadScopeScheduling):
    """xdist's scope scheduling with one scope per module, the real-engine modules one."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self._root = config.rootpath
        self._real: dict[str, bool] = {}

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        if module not in self._real:
            path = self._root / module
            self._real[module] = path.is_file() and runs_real_engines(Path(path).read_text())
        return REAL_ENGINE_GROUP if self._real[module] else module
