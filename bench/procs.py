"""The benchmarks' one child process: `Proc`, a `gateway.launch.process.ProcessTree` (a
session of its own, so a signal reaches exactly this part, and its whole tree stopped) that
logs to a file and can be started again from the same argv and environment.

Used synchronously by the fault and soak benchmarks (`bench.sim_fleet`, `bench.chaos_*`:
`start()` again, `signal()`, `kill()`, `stop()`) and from asyncio by the side-by-side runs
(`bench.peers`, `bench.overhead_ab`: `await Proc.spawn(...)`, `await proc.wait_http(url)`,
`await proc.stop_async()`), which keep the event loop free while a child forks, answers
or stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.launch.process import ProcessTree, wait_http


class Proc:
    """One restartable child, started at construction. `env` is added to ours (and
    PYTHONUNBUFFERED=1, so a log's tail is current)."""

    def __init__(
        self, name: str, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.tree: ProcessTree | None = None
        self.start()

    def start(self) -> None:
        """Start the child (again, after a stop or a kill) from the same argv and env."""
        self.tree = ProcessTree.start(self.name, self.args, self.log_path, env=self.env)

    @classmethod
    async def spawn(
        cls, name: str, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> Proc:
        """Start the process off the event loop (fork/exec and the log file's open)."""
        return await asyncio.to_thread(cls, name, args, log, env)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.tree.proc if self.tree is not None else None

    @property
    def pid(self) -> int:
        assert self.tree is not None
        return self.tree.pid

    def alive(self) -> bool:
        return self.tree is not None and self.tree.alive()

    def tail(self, n: int = 30) -> str:
        """The log's last `n` lines."""
        return self.tree.tail(n) if self.tree is not None else ""

    def signal(self, sig: int) -> None:
        """Signal the child's process group (SIGSTOP / SIGCONT: a frozen part)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    async def wait_http(self, url: str, timeout_s: float = 60.0, expect: int = 200) -> None:
        """Poll `url` until it answers `expect`; raise with the log's tail if the child exits
        first or it never does (`gateway.launch.process.wait_http`)."""
        assert self.tree is not None
        await asyncio.to_thread(wait_http, self.tree, url, timeout_s, expect)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the tree, SIGKILL what is left after `timeout_s` (a frozen tree is thawed
        first: a stopped process cannot act on SIGTERM)."""
        if self.tree is None:
            return
        self.signal(signal.SIGCONT)
        self.tree.stop(timeout_s)

    async def stop_async(self, timeout_s: float = 10.0) -> None:
        """`stop()` off the event loop."""
        await asyncio.to_thread(self.stop, timeout_s)

    def kill(self) -> None:
        """SIGKILL the child and its tree now (a crash)."""
        if self.tree is not None:
            self.tree.kill_all()


def sched_s(pid: int) -> tuple[float, float] | None:
    """(on a CPU, runnable but waiting for one) seconds of process `pid`'s live threads since
    each started, from `/proc/<pid>/task/*/schedstat` (nanoseconds); None where the kernel
    keeps no schedstat or the process is gone. The wait is what a busy machine costs a
    process beyond its own work."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return None
    on_cpu = waiting = 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                fields = f.read().split()
        except FileNotFoundError:
            continue  # the thread ended between the listing and the read
        if len(fields) < 2:
            return None
        on_cpu += int(fields[0])
        waiting += int(fields[1])
    return on_cpu / 1e9, waiting / 1e9


def sched_per_request(
    what: str,
    before: tuple[float, float] | None,
    after: tuple[float, float] | None,
    requests: int,
) -> dict[str, float]:
    """`what`'s CPU a request over the replay, and its time runnable but waiting for a core
    (what a machine whose cores the engines keep busy adds to time outside them)."""
    if before is None or after is None or requests < 1:
        return {}
    return {
        f"{what}_cpu_ms_per_request": round((after[0] - before[0]) * 1e3 / requests, 3),
        f"{what}_cpu_wait_ms_per_request": round((after[1] - before[1]) * 1e3 / requests, 3),
    }


def sum_sched(times: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    """Several processes' (CPU, wait) seconds together; None if any could not be read."""
    if any(t is None for t in times):
        return None
    return (sum(t[0] for t in times if t), sum(t[1] for t in times if t))
