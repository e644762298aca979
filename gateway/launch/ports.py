"""A port for a child process to listen on, picked so that nothing else takes it first.

Between choosing a port and the child binding it, anyone may take it. A port from bind(0)
comes from the kernel's ephemeral range, the range every outgoing connection and every other
bind(0) on the machine draws from too (vLLM's own port picking, other test workers), and a
child started with one failed to bind now and then ("address already in use": CI failures
of test_replicas and test_admin_cli). So the port is drawn at random from below that range,
where the kernel hands out nothing by itself, checked free by binding it, and never handed
out twice by one process (two children told the same port: the second cannot bind and its
URL reaches the first). Where the machine leaves no room below its ephemeral range, bind(0).
"""

from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path

LOWEST = 10_000  # below: well-known services (Redis 6379, PostgreSQL 5432, ...)
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 200
_handed_out: deque[int] = deque(maxlen=4096)  # this process's, newest last
_random = random.SystemRandom()  # not the seeded module-level generator a test may fix


def _below_ephemeral() -> range | None:
    """The ports below the kernel's ephemeral range, from LOWEST; None where unknown or
    too few."""
    try:
        low = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(LOWEST, low) if low - LOWEST >= 1000 else None


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_pick(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
    return port


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` nobody listens on now, not one this process handed out before."""
    ports = _below_ephemeral()
    for _ in range(_TRIES):
        port = _random.choice(ports) if ports is not None else _kernel_pick(host)
        if port not in _handed_out and (ports is None or _bindable(host, port)):
            _handed_out.append(port)
            return port
    raise OSError(f"no free port on {host} after {_TRIES} tries")
