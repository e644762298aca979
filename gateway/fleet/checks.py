"""The result of checking an instance before it joins the fleet: one `Check` per property
(gateway/fleet/validate.py runs them, gateway/fleet/seed.py adds the hash-seed one), and the
error that carries them to the admin call's 422."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from contracts.errors import AdminError


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


class ValidationFailedError(AdminError):
    def __init__(self, checks: list[Check]) -> None:
        self.checks = checks
        failed = "; ".join(f"{c.name}: {c.detail}" for c in checks if not c.ok)
        super().__init__(failed)

    def to_list(self) -> list[dict[str, Any]]:
        return [asdict(c) for c in self.checks]
