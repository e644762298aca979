"""What the operator page keeps between polls: its history of samples, the hottest sessions
and prefixes (filled by gateway/admin/ui/live.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.admin.ui.hot import HotTracker


@dataclass
class UiRuntime:
    history: deque[dict[str, Any]]
    hot: HotTracker = field(default_factory=HotTracker)
