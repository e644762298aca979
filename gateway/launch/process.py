"""Supervised child processes whose whole tree stops, whatever stops their supervisor.

`ProcessTree.start(name, argv, log_path, env=...)` runs argv in a session of its own (its own
process group: a Ctrl-C in the terminal reaches only the supervisor, which then stops
children in order), logging stdout+stderr to a file. Linux only (it reads /proc).

Why more than `Popen.terminate()`: a vLLM API server forks an EngineCore which forks a Worker;
killed alone, the API server leaves both alive (holding the KV-events socket and ~2.8 GB).
So `stop()` signals the whole process group and then, by pid, every descendant seen before
the signal (one that moved to a session of its own is still reached). Each child also gets
`PR_SET_PDEATHSIG = SIGTERM`: if the supervisor itself dies without stopping it (SIGKILL,
a crash), the kernel sends the child SIGTERM and it shuts its own tree down. The kernel
ties that to the *thread* that started the child: start trees from a thread that lives as
long as they should (the main thread; not a short-lived worker).

API:
- `tree.pid`, `tree.alive()`, `tree.returncode`, `tree.tail(n)` (the log's last lines)
- `tree.descendants()` -> pids of every live process below the leader (by /proc ppid walk)
- `tree.stop(timeout_s)` -> SIGTERM the group, wait, SIGKILL what is left (group + pids)
- `tree.kill_all()` -> SIGKILL the leader and every descendant now (a crash, for tests)
- `tree.kill_leader(sig)` -> signal the leader only (what a crash of one process looks like)
- `wait_http(tree, url, timeout_s)` -> poll until `url` answers, raising with the log's tail
  if the child exits first or never answers

The one supervisor: `warmgate up` (gateway/launch/up.py), the benchmarks' fleets (bench/peers.py)
and the tests' processes (tests/support/procs.py) all start and stop children through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

from contracts.errors import UpstreamError

PR_SET_PDEATHSIG = 1


class ChildFailedError(UpstreamError, RuntimeError):
    """A supervised child exited, was never started, or failed at what it was started for."""


class ChildNotReadyError(UpstreamError, TimeoutError):
    """A supervised child did not answer in time."""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent goes, then a session of its own."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    os.setsid()


def _children_map() -> dict[int, list[int]]:
    """ppid -> child pids, for every process visible in /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces or parentheses; split after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 2:
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def descendants_of(pid: int) -> list[int]:
    """Every live process below `pid` (children first, then theirs)."""
    children = _children_map()
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"  # a zombie is gone but for its parent's wait


class ProcessTree:
    """One supervised child and everything it starts."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log_path: Path, log: IO[bytes]):
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self._log: IO[bytes] | None = log
        self._seen: set[int] = set()

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        cpus: Collection[int] | None = None,
    ) -> ProcessTree:
        """Start `argv` (env: the complete environment; None inherits ours). `cpus`: the
        CPUs the child may run on, set before it starts, so everything it forks inherits
        them (None: ours)."""
        log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        allowed = frozenset(cpus) if cpus is not None else None

        def prepare() -> None:  # only system calls; no lock a thread could hold
            _die_with_parent()
            if allowed is not None:
                os.sched_setaffinity(0, allowed)

        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            preexec_fn=prepare,
        )
        return cls(name, proc, log_path, log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def descendants(self) -> list[int]:
        """Live processes below the leader; remembered so a later stop reaches them too."""
        pids = descendants_of(self.proc.pid) if self.alive() else []
        self._seen.update(pids)
        return pids

    def _group_pids(self) -> list[int]:
        """Live members of the leader's process group (orphans reparented elsewhere included)."""
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.getpgid(int(entry)) == self.proc.pid:
                        out.append(int(entry))
        return out

    def _remaining(self) -> list[int]:
        pids = set(self._seen) | set(self._group_pids())
        pids.discard(self.proc.pid)
        return [p for p in pids if _alive(p)]

    def _signal_all(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
        for pid in self._remaining():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill_leader(self, sig: int = signal.SIGKILL) -> None:
        """Signal the leader alone; its children live on (what a crashed API server leaves)."""
        self.descendants()
        if self.alive():
            os.kill(self.proc.pid, sig)

    def kill_all(self) -> None:
        """SIGKILL the leader and every descendant now, and reap the leader."""
        self.descendants()
        self._signal_all(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._wait_gone(5.0)
        self._close_log()

    def take_log(self) -> IO[bytes] | None:
        """Hand the open log over (to a subclass built around this tree)."""
        log, self._log = self._log, None
        return log

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._remaining():
                return True
            time.sleep(0.05)
        return not self._remaining()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the tree, wait up to `timeout_s`, then SIGKILL whatever is left."""
        self.descendants()
        if self.alive() or self._remaining():
            self._signal_all(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
            if self.alive() or not self._wait_gone(max(1.0, timeout_s / 3)):
                self._signal_all(signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
                self._wait_gone(5.0)
        self.proc.poll()
        self._close_log()

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def wait_http(tree: ProcessTree, url: str, timeout_s: float, expect: int = 200) -> None:
    """Poll `url` (sync: call it off the event loop) until it answers `expect`; raise with
    the log's tail if the child exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if not tree.alive():
            raise ChildFailedError(
                f"{tree.name} exited {tree.returncode}; log {tree.log_path}:\n{tree.tail()}"
            )
        try:
            r = httpx.get(url, timeout=1.0, trust_env=False)
            if r.status_code == expect:
                return
            last = f"status {r.status_code}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise ChildNotReadyError(
        f"{tree.name}: {url} not ready after {timeout_s:g}s ({last}); "
        f"log {tree.log_path}:\n{tree.tail()}"
    )
