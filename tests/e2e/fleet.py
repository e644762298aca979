"""A real stack on loopback for gateway tests: N simulated engines (`python -m sim.engine`)
and the gateway (`python -m gateway.launch.serve` on a YAML config), each its own process."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.procs import ManagedProcess, free_port, python_module

MODEL = "sim-qwen2.5-32b"


class Engine:
    """One simulated engine process (restartable on the same port)."""

    def __init__(
        self,
        tmp: Path,
        instance_id: str,
        time_scale: float,
        seed: int,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.extra_args = extra_args
        self.id = instance_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp
        self.time_scale = time_scale
        self.seed = seed
        self.starts = 0
        self.proc: ManagedProcess | None = None

    def start(self) -> None:
        self.starts += 1
        args = python_module(
            "sim.engine",
            "--port",
            str(self.port),
            "--instance-id",
            self.id,
            "--model",
            MODEL,
            "--time-scale",
            str(self.time_scale),
            "--seed",
            str(self.seed),
            *self.extra_args,
        )
        self.proc = ManagedProcess(args, self.tmp / f"engine-{self.id}-{self.starts}.log")

    def wait(self) -> None:
        assert self.proc is not None
        self.proc.wait_http(f"{self.url}/health", timeout_s=60)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.stop()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


class Fleet:
    """Engines plus one gateway in front of them."""

    def __init__(
        self,
        tmp: Path,
        instances: int = 3,
        *,
        time_scale: float = 0.001,
        settings: dict[str, Any] | None = None,
        extra_instances: list[dict[str, Any]] | None = None,
        engine_fields: dict[str, Any] | None = None,
        engine_args: tuple[str, ...] = (),
    ) -> None:
        self.tmp = tmp
        self.engines = [
            Engine(tmp, f"sim-{i}", time_scale, i, engine_args) for i in range(instances)
        ]
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.settings = settings or {}
        self.extra_instances = extra_instances or []
        self.engine_fields = engine_fields or {}  # more settings for every engine's entry
        self.gateway: ManagedProcess | None = None

    def start(self) -> Fleet:
        try:
            self._start()
        except BaseException:
            self.stop()  # never leave processes (or their log files) behind
            raise
        return self

    def _start(self) -> None:
        for e in self.engines:
            e.start()
        for e in self.engines:
            e.wait()
        config: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "instances": [{"id": e.id, "url": e.url, **self.engine_fields} for e in self.engines]
            + self.extra_instances,
            **self.settings,
        }
        path = self.tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        self.gateway = ManagedProcess(
            python_module("gateway.launch.serve", "--config", str(path)), self.tmp / "gateway.log"
        )
        self.gateway.wait_http(f"{self.base}/livez", timeout_s=60)

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for e in self.engines:
            e.stop()

    def admin(self, path: str) -> Any:
        return httpx.get(f"{self.base}/admin/{path}", timeout=10).json()

    def instance_health(self) -> dict[str, str]:
        return {i["id"]: i["health"]["state"] for i in self.admin("instances")["instances"]}


def wait_until(check: Any, timeout_s: float = 30.0, what: str = "condition") -> Any:
    """Poll `check()` until it returns something truthy (an eventual state, not a timing)."""
    import time

    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what} never became true (last: {last!r})")


@contextmanager
def fleet_behind_script(
    tmp: Path, script: str, instance_id: str, ready_path: str
) -> Iterator[Fleet]:
    """A gateway whose only instance is `script` (a Python HTTP server taking its port as
    argument), started and ready at `ready_path`; both stopped on exit."""
    path = tmp / f"{instance_id}_upstream.py"
    path.write_text(script)
    port = free_port()
    upstream = ManagedProcess([sys.executable, str(path), str(port)], tmp / "upstream.log")
    try:
        upstream.wait_http(f"http://127.0.0.1:{port}{ready_path}")
        fleet = Fleet(
            tmp, 0, extra_instances=[{"id": instance_id, "url": f"http://127.0.0.1:{port}"}]
        )
        try:
            fleet.start()
            yield fleet
        finally:
            fleet.stop()
    finally:
        upstream.stop()
