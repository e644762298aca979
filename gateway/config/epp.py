"""Settings of the Endpoint Picker (gateway/epp/): the Gateway API Inference Extension's
ext_proc gRPC server, off unless `epp.port` is set. Nested under `Settings`
(gateway/config/settings.py) as `epp`."""

from __future__ import annotations

from pydantic import Field

from gateway.config.base import StrictModel


class EppSettings(StrictModel):
    """The picker listens on `host:port` (gRPC, plaintext h2c as Envoy's ext_proc cluster
    speaks it) and answers the standard gRPC health service there too. An endpoint is named
    `ip:port` (the protocol's form): an instance whose URL names a host by DNS is resolved,
    and the answer kept `resolve_ttl_s`. The metadata namespaces are the protocol's
    defaults (docs/PROTOCOLS.md §EPP)."""

    port: int | None = Field(default=None, ge=0, le=65535)  # None: no picker
    host: str = "0.0.0.0"
    resolve_ttl_s: float = Field(default=10.0, gt=0)
    subset_namespace: str = "envoy.lb.subset_hint"  # where Envoy offers the subset
    destination_namespace: str = "envoy.lb"  # where the pick goes, and the served endpoint
    max_response_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)  # read for its usage
