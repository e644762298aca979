"""Start real processes on loopback and wait until they answer; stop them for sure. The
processes are `gateway.launch.process.ProcessTree`s, the supervisor `warmgate up` and the
benchmarks use too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.launch.ports import free_port as free_port  # the tests pick ports as the launchers do
from gateway.launch.process import ProcessTree, wait_http


class ManagedProcess(ProcessTree):
    """A child process (a session of its own) whose output goes to a log file."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None):
        self.args = list(args)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        started = ProcessTree.start(Path(self.args[0]).name, self.args, log_path, env=full_env)
        log = started.take_log()
        assert log is not None  # a tree just started holds its log
        super().__init__(started.name, started.proc, log_path, log)

    def wait_http(self, url: str, timeout_s: float = 30.0, expect: int = 200) -> None:
        wait_http(self, url, timeout_s, expect)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group at once (a crash, a freeze) and reap the leader."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)


def python_module(module: str, *args: str) -> list[str]:
    """argv that runs `python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *args]
