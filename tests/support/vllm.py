"""Real vLLM engines for the suite: one fleet configuration alive at a time, started once.

`VllmFleets` (the session fixture `vllm_fleets` in tests/conftest.py) hands out fleets by
configuration: `fleets.get()` is the default two engines; `fleets.get(block_size=..., ...)`
(any `FleetConfig` field) another one. It keeps them in the session's one `FleetSlot`
(tests/support/vllm_fleets.py, shared with the tierd-connector fleet): a configuration is
started at most once while it stays current, and asking for another kind stops the current
fleet first, so the suite never has more than 2 engines alive. Tests that need the
machine's memory for engines of their own call `fleets.release()`.

A test that breaks an engine (kills it, restarts it) must leave it running and ready again;
`get()` also restarts any engine found dead, so one failed test cannot poison the rest.

Outside CI, without the engine environment, every user of this skips with the install
command; in CI (`CI=true`) it fails instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.launch.models import ensure_tiny_model
from gateway.launch.vllm_fleet import FleetConfig, VllmFleet
from tests.support.engines import engine_python_or_skip
from tests.support.procs import ManagedProcess, free_port
from tests.support.vllm_fleets import FleetSlot

SERVED_MODEL = "warmgate-tiny"
_FIELDS = {f.name for f in fields(FleetConfig)}


class VllmFleets:
    """The session's plain vLLM fleets, by configuration, in the session's one `FleetSlot`."""

    def __init__(self, slot: FleetSlot) -> None:
        self.slot = slot
        self._model: Path | None = None
        self._python: Path | None = None

    def prepare(self) -> dict[str, Any]:
        """The engine environment (a skip or CI failure without it), the model, the defaults."""
        if self._python is None:
            self._python = engine_python_or_skip()
        if self._model is None:
            self._model = ensure_tiny_model(python=self._python)
        return {
            "model_dir": self._model,
            "python": self._python,
            "engines": 2,
            "served_model_name": SERVED_MODEL,
            "max_model_len": 4096,
            # 48 blocks of 128 tokens: tests see evictions (BlockRemoved) after a few prompts
            "num_gpu_blocks": 48,
            # each engine's processes on its own core, whatever the machine: unpinned, a
            # streaming engine's busy-polling EngineCore starved the gateway and the test
            # beside it for seconds (a 10 s header timeout fired once in CI)
            "pin_tree": True,
        }

    def get(self, **overrides: Any) -> VllmFleet:
        """The fleet for this configuration, started (once) and ready."""
        unknown = set(overrides) - _FIELDS
        if unknown:
            raise TypeError(f"not FleetConfig fields: {sorted(unknown)}")
        cfg_kwargs = {**self.prepare(), **overrides}
        kind = "vllm:" + repr(sorted((k, repr(v)) for k, v in cfg_kwargs.items()))
        if (os.cpu_count() or 1) < cfg_kwargs["engines"]:
            cfg_kwargs.setdefault("cores", tuple(0 for _ in range(cfg_kwargs["engines"])))
        fleet: VllmFleet = self.slot.get(
            kind, lambda run_dir: VllmFleet(FleetConfig(run_dir=run_dir, **cfg_kwargs))
        )
        for e in fleet:
            if not e.alive():  # a test left it dead: bring it back for the next one
                e.stop()
                e.start()
                e.wait_ready()
        return fleet

    def release(self) -> None:
        """Stop the current fleet, whatever its kind."""
        self.slot.release()


def gateway_config(fleet: VllmFleet, port: int, **settings: Any) -> dict[str, Any]:
    """A precise-mode gateway for `fleet` (settings: top-level keys merged over these)."""
    routing: dict[str, Any] = {"mode": "precise", "precise": {"hash": "vllm"}}
    config: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "instances": [
            {
                "id": e.id,
                "url": e.url,
                "models": [fleet.cfg.served_model_name],
                "kv_events_endpoint": e.kv_events_endpoint,
                "kv_events_replay_endpoint": e.kv_replay_endpoint,
                "priority_scheduling": fleet.cfg.scheduling_policy == "priority",
            }
            for e in fleet
        ],
        "routing": routing,
        "kv_events": {"enabled": True},
        "health": {"interval_s": 0.5, "timeout_s": 2.0, "failure_threshold": 1},
    }
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = _merge(config[key], value)
        else:
            config[key] = value
    return config


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Gateway:
    """`python -m gateway.launch.serve` as a process, in front of a real fleet."""

    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        self.port = int(config["port"])
        self.base = f"http://127.0.0.1:{self.port}"
        path = tmp / f"gateway-{self.port}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = tmp / f"gateway-{self.port}.log"
        self.proc = ManagedProcess(
            [sys.executable, "-m", "gateway.launch.serve", "--config", str(path)], self.log_path
        )

    def wait_ready(self, timeout_s: float = 60.0) -> Gateway:
        self.proc.wait_http(f"{self.base}/readyz", timeout_s=timeout_s)
        return self

    def admin(self, path: str) -> Any:
        return httpx.get(f"{self.base}/admin/{path}", timeout=10).json()

    def log_tail(self, lines: int = 30) -> str:
        """The end of the gateway's log, for a failing assertion's message."""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self.proc.stop()


@contextmanager
def gateway_for(tmp: Path, fleet: VllmFleet, **settings: Any) -> Iterator[Gateway]:
    gw = Gateway(tmp, gateway_config(fleet, free_port(), **settings))
    try:
        yield gw.wait_ready()
    finally:
        gw.stop()
