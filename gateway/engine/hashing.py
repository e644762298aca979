"""How a fleet's engines name their KV blocks, as precise mode reproduces them (pure).

Precise mode hashes every request once, for every candidate, so the instances' engines must
hash alike: one `hash_scheme`, an algorithm each of them has, and one seed. The seed is
`routing.precise.hash_seed` when set, else what each engine kind uses without one
(`Engine.unseeded_hash_seed`); when that is random (or the kinds disagree) it cannot be
reproduced and precise mode is refused. `fleet_hashing(engines, algo, hash_seed)` returns the
`FleetHashing` or raises (every error a `ConfigurationError` whose message says what to set).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from contracts.errors import ConfigurationError
from gateway.engine.base import Engine
from router.precise import BlockHasher, UnsupportedHashError


class MixedHashSchemesError(ConfigurationError, ValueError):
    """The fleet's engines hash their blocks by different schemes."""


class UnseededHashError(ConfigurationError, ValueError):
    """No seed the fleet's block hashes can be reproduced from."""


@dataclass(frozen=True, slots=True)
class FleetHashing:
    """The block hash of every instance: `engine`'s scheme, `algo`, `seed`."""

    engine: Engine
    algo: str
    seed: str

    def hasher(self, block_size: int) -> BlockHasher:
        return self.engine.block_hasher(algo=self.algo, seed=self.seed, block_size=block_size)


def _unseeded(engine: Engine, algo: str) -> str:
    """What `engine` does without a seed, for a message."""
    known = [
        f"{a} without {engine.hash_seed_source} is seeded with {seed!r} and needs no hash_seed"
        for a in engine.hash_algos
        if (seed := engine.unseeded_hash_seed(a)) is not None
    ]
    note = f" ({'; '.join(known)})" if known else ""
    return (
        f"without it {engine.label} seeds {algo} with random bytes per process{note}"
        if engine.unseeded_hash_seed(algo) is None
        else f"{engine.label} seeds {algo} with {engine.unseeded_hash_seed(algo)!r}"
    )


def fleet_hashing(engines: Iterable[Engine], algo: str, hash_seed: str | None) -> FleetHashing:
    """The fleet's block hash (`engines`: one per instance, or the default kind's when none)."""
    kinds = {e.kind: e for e in engines}
    if not kinds:
        raise MixedHashSchemesError("no engine to hash as")
    fleet = [kinds[k] for k in sorted(kinds)]
    schemes = {e.hash_scheme for e in fleet}
    if len(schemes) > 1:
        raise MixedHashSchemesError(
            "precise mode hashes as the engines do, and these engines hash otherwise than "
            f"each other: {', '.join(f'{e.kind} ({e.hash_scheme})' for e in fleet)}"
        )
    for e in fleet:
        if algo not in e.hash_algos:
            raise UnsupportedHashError(
                f"routing.precise.vllm_hash_algo {algo!r}: {e.label} hashes with one of "
                f"{', '.join(e.hash_algos)}"
            )
    seeds = {hash_seed if hash_seed is not None else e.unseeded_hash_seed(algo) for e in fleet}
    seed = seeds.pop() if len(seeds) == 1 else None
    if seed is None:
        sources = sorted({e.hash_seed_source for e in fleet})
        raise UnseededHashError(
            f"routing.mode=precise with {algo} needs routing.precise.hash_seed (the engines' "
            f"{' / '.join(sources)}): " + "; ".join(_unseeded(e, algo) for e in fleet) + "."
        )
    return FleetHashing(fleet[0], algo, seed)
