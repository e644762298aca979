"""Instances as the Endpoint Picker protocol names them: `ip:port`.

Envoy offers a subset of endpoints and routes to the one picked by address, so an instance
whose URL names its host by DNS (a StatefulSet pod's stable name) is resolved, off the event
loop's blocking calls (`loop.getaddrinfo`), and the address kept `ttl_s`. An IP literal is its
own name. An instance that does not resolve has no name: it is not offered to the pipeline."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from contracts.errors import InputError


class EndpointNameError(InputError, ValueError):
    """An endpoint named by the data plane is not `ip:port`."""


def host_port(url: str) -> tuple[str, int]:
    """The host and port an instance URL names (the scheme's default port when none)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


def endpoint(host: str, port: int) -> str:
    """`ip:port` (an IPv6 address in brackets, as Envoy writes it)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoints(value: str) -> list[str]:
    """A comma-separated `ip:port` list, normalised; a malformed entry is an error."""
    out = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        try:
            ipaddress.ip_address(host)
            ok = sep == ":" and port.isdigit() and 0 < int(port) < 65536
        except ValueError:
            ok = False
        if not ok:
            raise EndpointNameError(f"endpoint {item!r} is not ip:port")
        out.append(endpoint(host, int(port)))
    return out


class EndpointNames:
    """Instance id <-> `ip:port`, from the instances' URLs (`url_of`)."""

    def __init__(
        self,
        url_of: Callable[[str], str],
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url_of = url_of
        self._ttl_s = ttl_s
        self._clock = clock
        self._resolved: dict[str, tuple[float, str | None]] = {}  # host -> (until, address)

    async def name_of(self, instance: str) -> str | None:
        host, port = host_port(self._url_of(instance))
        address = await self._address(host)
        return None if address is None else endpoint(address, port)

    async def names(self, instances: Iterable[str]) -> dict[str, str]:
        """The named ones of `instances`: {instance: ip:port}."""
        out = {}
        for instance in instances:
            name = await self.name_of(instance)
            if name is not None:
                out[instance] = name
        return out

    async def _address(self, host: str) -> str | None:
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            pass
        now = self._clock()
        cached = self._resolved.get(host)
        if cached is not None and cached[0] > now:
            return cached[1]
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            address: str | None = str(infos[0][4][0]) if infos else None
        except OSError:
            address = None  # unresolvable for now: asked again after the TTL
        self._resolved[host] = (now + self._ttl_s, address)
        return address
