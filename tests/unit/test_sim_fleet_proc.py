"""bench.sim_fleet's processes are `gateway.launch.process.ProcessTree`s: stopping or killing
one ends its whole tree (a grandchild in a session of its own included), a frozen one stops
too, and `start()` runs it again from the same recipe. Real processes, no engine."""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from pathlib import Path

from bench.sim_fleet import Proc
from gateway.launch.process import ProcessTree, descendants_of

# a leader whose child forks a grandchild that moves to a session of its own
TREE = textwrap.dedent(
    """
    import os, time
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            time.sleep(600)
        time.sleep(600)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def _tree_of(proc: Proc) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(descendants_of(proc.pid)) < 2:
        time.sleep(0.05)
    assert proc.tree is not None
    kids = proc.tree.descendants()
    assert len(kids) == 2
    return kids


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def test_stop_and_kill_end_the_whole_tree_and_start_runs_it_again(tmp_path: Path) -> None:
    proc = Proc("tree", [sys.executable, "-c", TREE], tmp_path / "tree.log")
    try:
        assert isinstance(proc.tree, ProcessTree)
        first = [proc.pid, *_tree_of(proc)]
        proc.signal(signal.SIGSTOP)  # frozen, as the chaos benchmark's slow engine
        proc.stop(timeout_s=5)
        assert not proc.alive() and _gone(first)
        proc.start()
        second = [proc.pid, *_tree_of(proc)]
        assert second[0] != first[0] and proc.alive()
        proc.kill()
        assert not proc.alive() and _gone(second)
    finally:
        proc.stop(timeout_s=2)
