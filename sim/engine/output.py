"""Incremental output text with stop strings, as vLLM handles them.

How it works: pieces are appended one at a time; after each, only the tail that could hold a
newly completed stop string is searched. A found stop string ends the output there (the
stop string itself is not returned). While streaming, the last `len(longest stop) - 1`
characters are held back, so a stop string split across pieces is never sent in part.
"""

from __future__ import annotations

from collections.abc import Sequence

from contracts.errors import InputError


class OutputStoppedError(InputError, RuntimeError):
    """A piece appended to an output that a stop string has already ended."""


class OutputText:
    def __init__(self, stop: Sequence[str] = ()):
        self.stop = [s for s in stop if s]
        self._longest = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self._sent = 0
        self.stopped = False

    def append(self, piece: str) -> bool:
        """Add a piece; True when a stop string has been completed (the text is cut)."""
        if self.stopped:
            raise OutputStoppedError("output already stopped")
        start = max(0, len(self.text) - self._longest + 1)
        self.text += piece
        found = -1
        for s in self.stop:
            idx = self.text.find(s, start)
            if idx >= 0 and (found < 0 or idx < found):
                found = idx
        if found >= 0:
            self.text = self.text[:found]
            self.stopped = True
        return self.stopped

    def delta(self, final: bool) -> str:
        """Text not yet sent that can safely be sent now (everything, when `final`)."""
        hold = 0 if (final or self.stopped) else max(self._longest - 1, 0)
        end = max(self._sent, len(self.text) - hold)
        out = self.text[self._sent : end]
        self._sent = end
        return out
