"""gateway.launch.process: a supervised tree stops whole, with real processes (no engine)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

from gateway.launch.process import ProcessTree, descendants_of

# A leader that forks a child that forks a grandchild (like API server -> EngineCore ->
# Worker); the grandchild may move to a session of its own; every level ignores nothing.
TREE = textwrap.dedent(
    """
    import os, sys, time
    own_session = sys.argv[1] == "1"
    if os.fork() == 0:
        if os.fork() == 0:
            if own_session:
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


def _wait_for(cond: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return True
        time.sleep(0.05)
    return False


def _start(tmp_path: Path, own_session: bool = False) -> tuple[ProcessTree, list[int]]:
    tree = ProcessTree.start(
        "tree", [sys.executable, "-c", TREE, "1" if own_session else "0"], tmp_path / "t.log"
    )
    assert _wait_for(lambda: len(descendants_of(tree.pid)) == 2)
    return tree, tree.descendants()


def test_stop_ends_children_and_grandchildren(tmp_path: Path) -> None:
    tree, kids = _start(tmp_path)
    assert len(kids) == 2 and all(_alive(p) for p in kids)
    tree.stop(timeout_s=5)
    assert not tree.alive()
    assert _wait_for(lambda: not any(_alive(p) for p in kids))


def test_stop_reaches_a_grandchild_in_its_own_session(tmp_path: Path) -> None:
    tree, kids = _start(tmp_path, own_session=True)
    assert os.getpgid(kids[-1]) != tree.pid  # out of the group: only its pid reaches it
    tree.stop(timeout_s=5)
    assert _wait_for(lambda: not any(_alive(p) for p in kids))


def test_stop_after_the_leader_was_killed_ends_the_orphans(tmp_path: Path) -> None:
    tree, kids = _start(tmp_path)
    tree.kill_leader(signal.SIGKILL)
    assert _wait_for(lambda: not tree.alive())
    assert all(_alive(p) for p in kids)  # what a crashed API server leaves behind
    tree.stop(timeout_s=5)
    assert _wait_for(lambda: not any(_alive(p) for p in kids))


def test_kill_all_is_immediate_for_the_whole_tree(tmp_path: Path) -> None:
    tree, kids = _start(tmp_path)
    tree.kill_all()
    assert not tree.alive() and tree.returncode == -signal.SIGKILL
    assert _wait_for(lambda: not any(_alive(p) for p in kids))


def test_a_child_dies_with_its_supervisor(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: a supervisor killed with SIGKILL still takes its child down."""
    pid_file = tmp_path / "child.pid"
    supervisor = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from gateway.launch.process import ProcessTree
        t = ProcessTree.start("c", [sys.executable, "-c", "import time; time.sleep(600)"],
                              Path({str(tmp_path / "c.log")!r}))
        Path({str(pid_file)!r}).write_text(str(t.pid))
        time.sleep(600)
        """
    )
    outer = ProcessTree.start("sup", [sys.executable, "-c", supervisor], tmp_path / "s.log")
    assert _wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
    child = int(pid_file.read_text())
    assert _alive(child)
    outer.kill_leader(signal.SIGKILL)
    assert _wait_for(lambda: not _alive(child)), outer.tail()
    outer.stop()


def test_cpus_pin_the_leader_and_everything_it_forks(tmp_path: Path) -> None:
    # the last CPU we may use: never the whole set, on a machine of two or more
    mine = sorted(os.sched_getaffinity(0))
    pinned = {mine[-1]}
    tree = ProcessTree.start(
        "tree", [sys.executable, "-c", TREE, "0"], tmp_path / "t.log", cpus=pinned
    )
    try:
        assert _wait_for(lambda: len(descendants_of(tree.pid)) == 2)
        for pid in [tree.pid, *tree.descendants()]:
            assert os.sched_getaffinity(pid) == pinned, pid
        assert os.sched_getaffinity(0) == set(mine)  # ours is untouched
    finally:
        tree.stop(timeout_s=5)


def test_without_cpus_the_tree_runs_where_we_may(tmp_path: Path) -> None:
    tree = ProcessTree.start("tree", [sys.executable, "-c", TREE, "0"], tmp_path / "t.log")
    try:
        assert _wait_for(lambda: len(descendants_of(tree.pid)) == 2)
        assert os.sched_getaffinity(tree.pid) == os.sched_getaffinity(0)
    finally:
        tree.stop(timeout_s=5)
