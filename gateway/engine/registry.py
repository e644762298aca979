"""The engine kinds by name, the values `instances[].engine` takes: an immutable mapping
`ENGINES` (kind -> `Engine`), `engine_for(kind)` (raises `UnknownEngineError` naming the known
kinds), `DEFAULT_KIND` ("vllm", what an instance without `engine` is). A new kind is one line
here beside its module (`gateway.engine.base` says what it implements)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from contracts.errors import ConfigurationError
from gateway.engine.base import Engine
from gateway.engine.sim import SIM
from gateway.engine.vllm import VLLM

ENGINES: Mapping[str, Engine] = MappingProxyType({e.kind: e for e in (VLLM, SIM)})
DEFAULT_KIND = "vllm"


class UnknownEngineError(ConfigurationError, ValueError):
    """`instances[].engine` names no registered engine kind."""


def engine_kinds() -> tuple[str, ...]:
    return tuple(sorted(ENGINES))


def engine_for(kind: str) -> Engine:
    """The engine kind named `kind`."""
    engine = ENGINES.get(kind)
    if engine is None:
        raise UnknownEngineError(
            f"unknown engine kind {kind!r}: instances[].engine is one of "
            f"{', '.join(engine_kinds())}"
        )
    return engine
