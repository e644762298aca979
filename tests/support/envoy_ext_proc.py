"""Drive the endpoint picker as Envoy's ext_proc filter does (request body BUFFERED, response
headers sent, response body STREAMED), over a real gRPC channel, and carry the request to
the endpoint it picked over real HTTP, as Envoy's router would."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf.struct_pb2 import Struct

DESTINATION = "x-gateway-destination-endpoint"


def headers_of(pairs: dict[str, str]) -> HeaderMap:
    return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])


def mutated(mutation: Any) -> dict[str, str]:
    return {o.header.key: o.header.raw_value.decode() for o in mutation.set_headers}


@dataclass
class Exchange:
    """What one request's ext_proc stream said, and what reached the client."""

    picked: ep.ProcessingResponse | None = None  # the answer to the request body
    immediate: ep.ImmediateResponse | None = None
    endpoints: list[str] = field(default_factory=list)
    served_by: str | None = None  # the engine's x-engine-instance
    client_headers: dict[str, str] = field(default_factory=dict)
    client_body: bytes = b""

    @property
    def metadata_value(self) -> str:
        assert self.picked is not None
        meta = json.loads(_struct_json(self.picked.dynamic_metadata))
        value: str = meta["envoy.lb"][DESTINATION]
        return value

    def error(self) -> tuple[int, dict[str, Any]]:
        assert self.immediate is not None
        return self.immediate.status.code, json.loads(self.immediate.body)


def _struct_json(s: Struct) -> str:
    from google.protobuf.json_format import MessageToJson

    return str(MessageToJson(s))


class EnvoyLike:
    """One gRPC channel to the picker; `request()` runs one HTTP request through it."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = ep_grpc.ExternalProcessorStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def request(
        self,
        path: str,
        body: dict[str, Any] | bytes,
        *,
        headers: dict[str, str] | None = None,
        subset: list[str] | None = None,
        serve_from: int = 0,
    ) -> Exchange:
        """`serve_from`: which of the picked endpoints serves (1: Envoy retried on the first
        fallback)."""
        sent: queue.Queue[ep.ProcessingRequest | None] = queue.Queue()
        replies: Iterator[ep.ProcessingResponse] = self.stub.Process(iter(sent.get, None))
        out = Exchange()
        try:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            head = {":method": "POST", ":path": path, "content-type": "application/json"}
            head |= headers or {}
            first = ep.ProcessingRequest(
                request_headers=ep.HttpHeaders(headers=headers_of(head), end_of_stream=False)
            )
            if subset is not None:
                hint = Struct()
                hint.update({"x-gateway-destination-endpoint-subset": subset})
                first.metadata_context.CopyFrom(
                    Metadata(filter_metadata={"envoy.lb.subset_hint": hint})
                )
            sent.put(first)
            reply = next(replies)
            assert reply.WhichOneof("response") == "request_headers", reply
            sent.put(ep.ProcessingRequest(request_body=ep.HttpBody(body=raw, end_of_stream=True)))
            reply = next(replies)
            if reply.WhichOneof("response") == "immediate_response":
                out.immediate = reply.immediate_response
                return out
            out.picked = reply
            common = reply.request_body.response
            value = mutated(common.header_mutation)[DESTINATION]
            out.endpoints = value.split(",")
            if common.HasField("body_mutation"):
                raw = common.body_mutation.body
            endpoint = out.endpoints[serve_from]
            self._serve(sent, replies, endpoint, path, raw, out)
            return out
        finally:
            sent.put(None)
            for _ in replies:  # the picker closes its side
                pass

    def _serve(
        self,
        sent: queue.Queue[ep.ProcessingRequest | None],
        replies: Iterator[ep.ProcessingResponse],
        endpoint: str,
        path: str,
        raw: bytes,
        out: Exchange,
    ) -> None:
        served = Struct()
        served.update({"x-gateway-destination-endpoint-served": endpoint})
        meta = Metadata(filter_metadata={"envoy.lb": served})
        with httpx.stream(
            "POST",
            f"http://{endpoint}{path}",
            content=raw,
            headers={"content-type": "application/json"},
            timeout=30,
        ) as r:
            out.served_by = r.headers.get("x-engine-instance")
            head = {":status": str(r.status_code), "content-type": r.headers["content-type"]}
            sent.put(
                ep.ProcessingRequest(
                    response_headers=ep.HttpHeaders(headers=headers_of(head)),
                    metadata_context=meta,
                )
            )
            reply = next(replies)
            shown = mutated(reply.response_headers.response.header_mutation)
            out.client_headers = {**head, **shown}
            for chunk in r.iter_raw():
                out.client_body += self._body(sent, replies, chunk, end=False)
        out.client_body += self._body(sent, replies, b"", end=True)

    @staticmethod
    def _body(
        sent: queue.Queue[ep.ProcessingRequest | None],
        replies: Iterator[ep.ProcessingResponse],
        chunk: bytes,
        *,
        end: bool,
    ) -> bytes:
        sent.put(ep.ProcessingRequest(response_body=ep.HttpBody(body=chunk, end_of_stream=end)))
        reply = next(replies).response_body.response
        return bytes(reply.body_mutation.body) if reply.HasField("body_mutation") else chunk
