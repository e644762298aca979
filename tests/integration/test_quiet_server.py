"""gateway.http.quiet_server: an idle server wakes about once a second, not ten times, and
still refreshes its Date header each second and stops at once on SIGTERM."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import httpx

from tests.support.procs import ManagedProcess, free_port

_SERVE = """
import sys, uvicorn
from gateway.http import quiet_server
from gateway.http.quiet_server import QuietServer

if len(sys.argv) > 3:  # a tick of an hour: only the exit handler's wake-up can end the wait
    quiet_server.TICK_S = float(sys.argv[3])

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

cls = QuietServer if sys.argv[2] == "quiet" else uvicorn.Server
cls(uvicorn.Config(app, port=int(sys.argv[1]), log_level="warning")).run()
"""


def _wakeups(pid: int) -> int:
    """Voluntary context switches of the process's main thread so far (each idle wake-up
    of its event loop is one)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc status")


def _idle_wakeups(kind: str, tmp_path: Path, seconds: float = 3.0) -> tuple[int, ManagedProcess]:
    port = free_port()
    args = [sys.executable, "-c", _SERVE, str(port), kind]
    proc = ManagedProcess(args, tmp_path / f"{kind}.log")
    proc.wait_http(f"http://127.0.0.1:{port}/", timeout_s=30)
    time.sleep(0.5)  # past the first request's own work
    before = _wakeups(proc.proc.pid)
    time.sleep(seconds)
    return _wakeups(proc.proc.pid) - before, proc


def test_an_idle_quiet_server_wakes_far_less_than_uvicorns(tmp_path: Path) -> None:
    uvicorns, plain = _idle_wakeups("uvicorn", tmp_path)
    plain.stop()
    quiet, proc = _idle_wakeups("quiet", tmp_path)
    proc.stop()
    # uvicorn ticks every 0.1 s: about 30 in 3 s; the quiet one about 3
    assert uvicorns >= 20, uvicorns
    assert quiet <= uvicorns // 3, (quiet, uvicorns)


def test_the_date_header_moves_on_each_second(tmp_path: Path) -> None:
    port = free_port()
    args = [sys.executable, "-c", _SERVE, str(port), "quiet"]
    proc = ManagedProcess(args, tmp_path / "quiet.log")
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/", timeout_s=30)
        with httpx.Client(trust_env=False) as client:
            first = client.get(f"http://127.0.0.1:{port}/").headers["date"]
            time.sleep(2.2)
            second = client.get(f"http://127.0.0.1:{port}/").headers["date"]
        assert first != second  # refreshed while the loop slept on its once-a-second tick
    finally:
        proc.stop()


def test_sigterm_wakes_the_loop_without_waiting_out_the_tick(tmp_path: Path) -> None:
    port = free_port()
    args = [sys.executable, "-c", _SERVE, str(port), "quiet", "3600"]
    proc = ManagedProcess(args, tmp_path / "quiet.log")
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/", timeout_s=30)
        proc.proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down, then re-raises the signal it caught: the process ends by it
        assert proc.proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.stop()
