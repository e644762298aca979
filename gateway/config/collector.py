"""Settings of the garbage collector of `warmgate serve`'s process (`gc:` in YAML,
`WARMGATE_GC__*`); applied by `gateway.observe.gc_pauses.tune_collector`.

CPython's defaults (700, 10, 10) suit a script: a young collection every 700 container
objects allocated and not yet freed. A gateway under load allocates a few dozen a request
(coroutines, futures, handles, header dicts, the router's records), so at 500 requests/s it
ran about 25 young collections a second, and each one walks every young object still alive:
the requests in flight, the same few thousand objects over and over. The soak at 1.2x
capacity measured a fifth to a third of the gateway's CPU in collections
(docs/BENCHMARKS.md, 2026-12-02). A collection's cost follows the live young objects, not the
allocations between two collections, so a threshold of 50,000 makes young collections ~70x
rarer for about the same cost each. What it costs: cyclic garbage lives until the next
collection, at most that many objects (a few MB).
"""

from __future__ import annotations

from pydantic import Field

from gateway.config.base import StrictModel


class CollectorSettings(StrictModel):
    """`gc.set_threshold(young, middle, old)` at start-up; `freeze_after_start`: once the app
    has started (routes, router, settings, clients: they live as long as the process), move
    what exists into the permanent generation, which no collection walks again."""

    young: int = Field(default=50_000, ge=1)  # containers allocated less freed per collection
    middle: int = Field(default=10, ge=1)  # young collections per middle one
    old: int = Field(default=10, ge=1)  # middle collections per full one (and CPython's 25%)
    freeze_after_start: bool = True
