"""A sliding window of recent samples (TTFTs) with percentiles: samples older than the
window, or beyond the size bound, fall out; percentiles sort a copy (nearest rank)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable


class SlidingWindow:
    """Recent (time, value) samples bounded by age and count."""

    def __init__(
        self,
        window_s: float,
        max_samples: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._clock = clock

    def add(self, value: float) -> None:
        self._samples.append((self._clock(), value))

    def _prune(self) -> None:
        horizon = self._clock() - self._window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()

    def values(self) -> list[float]:
        self._prune()
        return [v for _, v in self._samples]

    def percentile(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1) by nearest rank; None when empty."""
        values = sorted(self.values())
        if not values:
            return None
        rank = max(1, math.ceil(q * len(values)))
        return values[rank - 1]

    def __len__(self) -> int:
        self._prune()
        return len(self._samples)
