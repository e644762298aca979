"""Async client of a tierd (httpx), used by the gateway and the simulated engine.

Intended use::

    async with TierdClient("http://127.0.0.1:8101") as tierd:
        # gateway, before proxying a routed request (in a background task):
        await tierd.prefetch(chain, deadline_s=0.3, session=player_id)
        # engine, before prefill: how much of the prompt's chain is where
        where = await tierd.lookup(chain)          # {"available": n, "tiers": [...], ...}
        for h in chain[: where["available"]]:
            kv = await tierd.get_slice(h)          # bytes, or None if it vanished
        # engine, after prefill: store what it computed
        await tierd.put_slice(h, kv, parent=prev, tokens=64, session=player_id)
        await tierd.snapshot(chain)                # a dialogue as one cold object
        bw = (await tierd.stats())["bandwidth_bytes_per_s"]

Hashes are unsigned 64-bit ints (the router's block hashes). Every call raises
`httpx.HTTPError` on transport failure and `TierdError` on an error answer, except
`get_slice` (None on 404).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx

from contracts.errors import UpstreamError
from contracts.tiers import TIERD_ARENA

PREFETCH_PATH = "/v1/prefetch"


def prefetch_body(
    hashes: Sequence[int], deadline_s: float, session: str | None = None, *, wait: bool = False
) -> dict[str, Any]:
    """The body of a prefetch hint (`POST PREFETCH_PATH`), for any HTTP client."""
    return {"hashes": list(hashes), "deadline_s": deadline_s, "session": session, "wait": wait}


class TierdError(UpstreamError, RuntimeError):
    """tierd answered with an error status."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"tierd answered {status}: {body[:300]}")
        self.status = status


class TierdClient:
    """One connection pool to one tierd."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._own = client is None
        self._http = client or httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s)

    async def __aenter__(self) -> TierdClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    def _url(self, path: str) -> str:
        return path if self._own else f"{self.base_url}{path}"

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        r = await self._http.request(method, self._url(path), json=body)
        if r.status_code >= 400:
            raise TierdError(r.status_code, r.text)
        return r.json()

    async def prefetch(
        self,
        hashes: Sequence[int],
        deadline_s: float,
        session: str | None = None,
        *,
        wait: bool = False,
    ) -> dict[str, Any]:
        """Ask for a chain in L1 within `deadline_s`. `wait=True` answers the outcome
        (`hit`, `on_time`, `late`, `abandoned`, `miss` counts) after at most the deadline."""
        body = prefetch_body(hashes, deadline_s, session, wait=wait)
        result: dict[str, Any] = await self._json("POST", PREFETCH_PATH, body)
        return result

    async def lookup(self, hashes: Sequence[int]) -> dict[str, Any]:
        """`available` (leading run held anywhere), `tiers` (its tier per block), `leading`
        (leading run per tier: GPU, ARRAY, SNAPSHOT) and `counts` of the available run."""
        result: dict[str, Any] = await self._json("POST", "/v1/lookup", {"hashes": list(hashes)})
        return result

    async def put_slice(
        self,
        block_hash: int,
        data: bytes,
        parent: int | None = None,
        tokens: int | None = None,
        session: str | None = None,
    ) -> bool:
        """Store a slice in L1; True if new, False if it was there already."""
        params: dict[str, str | int] = {}
        if parent is not None:
            params["parent"] = parent
        if tokens is not None:
            params["tokens"] = tokens
        if session is not None:
            params["session"] = session
        r = await self._http.put(
            self._url(f"/v1/slices/{block_hash}"),
            content=data,
            params=params,
            headers={"content-type": "application/octet-stream"},
        )
        if r.status_code >= 400:
            raise TierdError(r.status_code, r.text)
        return bool(r.json()["stored"])

    async def get_slice(self, block_hash: int) -> bytes | None:
        """The slice's bytes (verified, from the fastest tier holding it) or None."""
        r = await self._http.get(self._url(f"/v1/slices/{block_hash}"))
        if r.status_code == 404:
            return None
        if r.status_code >= 400:
            raise TierdError(r.status_code, r.text)
        return r.content

    async def evict(self, hashes: Sequence[int] | None = None, tier: str = TIERD_ARENA.name) -> int:
        """Evict from one tier (GPU demotes per the gate; ARRAY/SNAPSHOT delete)."""
        body = {"hashes": None if hashes is None else list(hashes), "tier": tier}
        result = await self._json("POST", "/v1/evict", body)
        return int(result["evicted"])

    async def snapshot(self, hashes: Sequence[int], *, wait: bool = False) -> dict[str, Any]:
        """Write a chain as one cold snapshot object (in the background unless `wait`)."""
        body = {"hashes": list(hashes), "wait": wait}
        result: dict[str, Any] = await self._json("POST", "/v1/snapshot", body)
        return result

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._json("GET", "/v1/stats")
        return result

    async def ready(self) -> bool:
        try:
            r = await self._http.get(self._url("/readyz"))
        except httpx.HTTPError:
            return False
        return r.status_code == 200
