"""Processes for the fault and soak benchmarks: simulated engines, tierds, Redis and gateway
replicas on loopback, each a `bench.procs.Proc` (a `gateway.launch.process.ProcessTree`: its
own process group, so a signal reaches exactly one part; restartable from the same recipe),
each logging to a file in the run directory, all stopped for sure at the end."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.procs import Proc
from gateway.launch.ports import free_port
from gateway.launch.process import wait_http as process_wait_http

MODEL = "sim-qwen2.5-32b"


def wait_http(url: str, timeout_s: float = 60.0, proc: Proc | None = None) -> None:
    """Poll `url` until it answers 200; with `proc`, raise with its log's tail if it exits."""
    if proc is not None and proc.tree is not None:
        process_wait_http(proc.tree, url, timeout_s)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


@dataclass
class SimFleet:
    """Engines (+ tierds, + Redis) and gateway replicas. Every engine has the same seed, so
    any of them answers a prompt with the same text (the benchmarks check answers so)."""

    run_dir: Path
    instances: int = 3
    time_scale: float = 0.05
    tierd: bool = False
    redis: bool = False
    replicas: int = 1
    gateway_settings: dict[str, Any] = field(default_factory=dict)
    engine_args: tuple[str, ...] = ()
    tierd_args: tuple[str, ...] = ()
    engines: list[Proc] = field(default_factory=list)
    engine_urls: list[str] = field(default_factory=list)
    tierds: list[Proc] = field(default_factory=list)
    tierd_urls: list[str] = field(default_factory=list)
    redis_proc: Proc | None = None
    redis_port: int = 0
    gateways: list[Proc] = field(default_factory=list)
    gateway_urls: list[str] = field(default_factory=list)
    array_dir: Path | None = None
    # how `gateway.launch.serve` is run: `python -m` it, or through a wrapper such as bench.memtrace
    gateway_launcher: tuple[str, ...] = ("-m",)
    model: str = MODEL  # what the load asks for, with `body_extra`
    body_extra: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})

    def start(self) -> SimFleet:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        py = sys.executable
        if self.redis:
            server = shutil.which("redis-server")
            if server is None:
                raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
            self.redis_port = free_port()
            self.redis_proc = Proc(
                "redis",
                [server, "--port", str(self.redis_port), "--save", "", "--appendonly", "no"],
                self.run_dir / "redis.log",
            )
            wait_redis(self.redis_port)
        if self.tierd:
            self.array_dir = self.run_dir / "array"
            self.array_dir.mkdir(exist_ok=True)
            for i in range(self.instances):
                port = free_port()
                args = [
                    py, "-m", "tierd.cli", "serve", "--port", str(port), "--instance-id",
                    f"sim-{i}", "--array-dir", str(self.array_dir),
                    "--snapshot-dir", str(self.run_dir / f"snap-{i}"), *self.tierd_args,
                ]  # fmt: skip
                self.tierds.append(Proc(f"tierd-{i}", args, self.run_dir / f"tierd-{i}.log"))
                self.tierd_urls.append(f"http://127.0.0.1:{port}")
            for proc, url in zip(self.tierds, self.tierd_urls, strict=True):
                wait_http(f"{url}/livez", proc=proc)
        for i in range(self.instances):
            port = free_port()
            args = [
                py, "-m", "sim.engine", "--port", str(port), "--instance-id", f"sim-{i}",
                "--model", MODEL, "--time-scale", str(self.time_scale), "--seed", "0",
                *self.engine_args,
            ]  # fmt: skip
            if self.tierd:
                args += ["--tierd-url", self.tierd_urls[i]]
            self.engines.append(Proc(f"sim-{i}", args, self.run_dir / f"engine-{i}.log"))
            self.engine_urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(self.engines, self.engine_urls, strict=True):
            wait_http(f"{url}/health", proc=proc)
        for r in range(self.replicas):
            self.gateways.append(self._gateway(r))
        for proc, url in zip(self.gateways, self.gateway_urls, strict=True):
            wait_http(f"{url}/readyz", proc=proc)

    def gateway_config(self, port: int, replica: int) -> dict[str, Any]:
        instances = []
        for i, url in enumerate(self.engine_urls):
            inst: dict[str, Any] = {"id": f"sim-{i}", "url": url, "engine": "sim"}
            if self.tierd:
                inst["tierd_url"] = self.tierd_urls[i]
            instances.append(inst)
        config: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": port,
            "log_level": "warning",
            "instances": instances,
            **self.gateway_settings,
        }
        if self.redis:
            config["state"] = {
                "backend": "redis",
                "redis_url": f"redis://127.0.0.1:{self.redis_port}/0",
                "replica_id": f"replica-{replica}",
            }
        return config

    def _gateway(self, replica: int) -> Proc:
        port = free_port()
        path = self.run_dir / f"gateway-{replica}.yaml"
        path.write_text(yaml.safe_dump(self.gateway_config(port, replica)))
        self.gateway_urls.append(f"http://127.0.0.1:{port}")
        args = [
            sys.executable,
            *self.gateway_launcher,
            "gateway.launch.serve",
            "--config",
            str(path),
        ]
        return Proc(f"gateway-{replica}", args, self.run_dir / f"gateway-{replica}.log")

    def restart(self, proc: Proc, ready_url: str) -> None:
        proc.stop()
        proc.start()
        wait_http(ready_url, proc=proc)

    def stop(self) -> None:
        for p in [*self.gateways, *self.engines, *self.tierds]:
            p.stop()
        if self.redis_proc is not None:
            self.redis_proc.stop()


def wait_redis(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"redis on {port} never answered")


def proc_sample(pid: int) -> dict[str, float]:
    """RSS (bytes), open descriptors and CPU seconds (user + system) of a process, from /proc."""
    rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = float(line.split()[1]) * 1024
    fds = float(len(os.listdir(f"/proc/{pid}/fd")))
    with open(f"/proc/{pid}/stat") as f:  # utime, stime: fields 14, 15 after the (comm)
        fields = f.read().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return {"rss_bytes": rss, "fds": fds, "cpu_s": cpu_s}
