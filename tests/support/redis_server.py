"""A real Redis for tests: the one on REDIS_URL if it answers, else one started here."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import redis

from tests.support.procs import free_port


def _answers(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
        ok = bool(client.ping())
        client.close()
        return ok
    except redis.RedisError:
        return False


class RedisServer:
    """Owns a private redis-server process (used when none answers, and by outage tests
    that must stop and restart Redis without disturbing anyone else)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _answers(self.url):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


def shared_redis_url() -> tuple[str, RedisServer | None]:
    """REDIS_URL when it answers; else a private server (the caller stops it)."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if _answers(url):
        return url, None
    server = RedisServer()
    server.start()
    return server.url, server
