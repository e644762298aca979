"""The benchmarks' one process class, `bench.procs.Proc` (bench.sim_fleet's and bench.peers'
children), over `gateway.launch.process.ProcessTree`: stopping or killing one ends its whole
tree (a grandchild in a session of its own included), a frozen one stops too, `start()` runs
it again from the same recipe; from asyncio it spawns, waits for its HTTP (raising with its
log when it exits first) and stops. Real processes, no engine."""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.procs import Proc
from gateway.launch.ports import free_port
from gateway.launch.process import ChildFailedError, ProcessTree, descendants_of

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


# an HTTP child that answers 200 on every GET and prints its port's readiness to its log
SERVER = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
    print("serving", flush=True)
    server.serve_forever()
    """
)


async def test_the_async_side_spawns_waits_for_http_tails_and_stops(tmp_path: Path) -> None:
    """bench.peers' use: spawn off the loop, wait for the child's HTTP, read its log, stop."""
    port = free_port()
    args = [sys.executable, "-c", SERVER, str(port)]
    proc = await Proc.spawn("server", args, tmp_path / "server.log", {"EXTRA": "1"})
    try:
        assert proc.env["EXTRA"] == "1" and proc.env["PYTHONUNBUFFERED"] == "1"
        await proc.wait_http(f"http://127.0.0.1:{port}/", timeout_s=30)
        assert "serving" in proc.tail()
        pid = proc.pid
        await proc.stop_async(timeout_s=5)
        assert not proc.alive() and _gone([pid])
    finally:
        proc.stop(timeout_s=2)


async def test_wait_http_raises_with_the_log_when_the_child_exits(tmp_path: Path) -> None:
    args = [sys.executable, "-c", "print('bad flag'); raise SystemExit(3)"]
    proc = await Proc.spawn("gone", args, tmp_path / "gone.log")
    try:
        with pytest.raises(ChildFailedError, match="bad flag"):
            await proc.wait_http(f"http://127.0.0.1:{free_port()}/", timeout_s=30)
    finally:
        await proc.stop_async(timeout_s=2)
