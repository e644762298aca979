"""gateway.launch.ports.free_port: below the kernel's ephemeral range, free when handed out,
never twice from one process."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.launch import ports


class _Script:
    """Stands in for the random draw: the ports given, in order."""

    def __init__(self, picks: list[int]) -> None:
        self.picks: Iterator[int] = iter(picks)

    def choice(self, _: object) -> int:
        return next(self.picks)


def _listening() -> socket.socket:
    s = socket.create_server(("127.0.0.1", 0))
    return s


def test_the_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    port = ports.free_port()
    assert ports.LOWEST <= port < low
    with socket.create_server(("127.0.0.1", port)):
        pass


def test_a_port_in_use_or_handed_out_before_is_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_use = _listening()
    try:
        taken = in_use.getsockname()[1]
        monkeypatch.setattr(ports, "_below_ephemeral", lambda: range(1024, 65536))
        first = ports.free_port()  # a real draw, remembered as handed out
        monkeypatch.setattr(ports, "_random", _Script([taken, first, first]))
        with pytest.raises(StopIteration):  # both scripted ports refused, the draw ran out
            ports.free_port()
        free = _listening()
        spare = free.getsockname()[1]
        free.close()
        monkeypatch.setattr(ports, "_random", _Script([taken, first, spare]))
        assert ports.free_port() == spare
    finally:
        in_use.close()


def test_without_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_EPHEMERAL", Path("/nonexistent/ip_local_port_range"))
    port = ports.free_port()
    with socket.create_server(("127.0.0.1", port)):
        pass
