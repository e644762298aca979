"""Endpoint names of the Endpoint Picker protocol (gateway/epp/endpoints.py): `ip:port`,
IPv6 in brackets, instance URLs by DNS resolved (a real resolver: `localhost`), kept for the
TTL, an unresolvable host unnamed; malformed names refused with an InputError."""

from __future__ import annotations

import pytest

from contracts.errors import InputError
from gateway.epp.endpoints import EndpointNames, endpoint, host_port, parse_endpoints


def test_names_and_lists() -> None:
    assert host_port("http://10.0.0.7:8100/v1") == ("10.0.0.7", 8100)
    assert host_port("https://engine") == ("engine", 443)
    assert endpoint("fd00::1", 8000) == "[fd00::1]:8000"
    assert parse_endpoints("10.0.0.1:8000, [fd00::1]:9,") == ["10.0.0.1:8000", "[fd00::1]:9"]
    for bad in ("10.0.0.1", "engine-0:8000", "10.0.0.1:0", "10.0.0.1:x", "10.0.0.1:70000"):
        with pytest.raises(InputError):
            parse_endpoints(bad)


async def test_instances_are_named_by_address() -> None:
    urls = {
        "a": "http://127.0.0.1:8100",
        "b": "http://localhost:8200",
        "c": "http://no-such-host.invalid:8300",
    }
    now = [0.0]
    names = EndpointNames(urls.__getitem__, ttl_s=10, clock=lambda: now[0])
    got = await names.names(["a", "b", "c"])
    assert got["a"] == "127.0.0.1:8100"
    assert got["b"] in {"127.0.0.1:8200", "[::1]:8200"}
    assert "c" not in got  # unresolvable: not offered
    urls["b"] = "http://127.0.0.2:8200"  # the port and host read again; the address kept...
    assert await names.name_of("b") == "127.0.0.2:8200"  # ...an IP literal is its own name
    urls["b"] = "http://localhost:8201"
    assert (await names.name_of("b") or "").endswith(":8201")
