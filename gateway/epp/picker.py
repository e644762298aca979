"""One ext_proc stream of the Endpoint Picker: Envoy's messages for one HTTP request in, the
picker's answers out (the Gateway API Inference Extension's EPP protocol, docs/PROTOCOLS.md
§EPP; Envoy's ext_proc protos from `xds-protos`).

Envoy runs the filter with the request body BUFFERED (so the headers wait for the pick) and
the response headers and body sent (STREAMED, so tokens are not held back):
1. request headers: kept, answered with no change;
2. request body (every chunk until `end_of_stream`): parsed as the HTTP proxy parses it and
   decided with the same `RequestPipeline.decide`, among the subset Envoy offers if it
   offers one; the answer sets `x-gateway-destination-endpoint` (the pick, then its
   fallbacks, `ip:port,ip:port`) as a header and in the `envoy.lb` dynamic metadata, the
   same value in both. A stream's body gets `stream_options.include_usage` as the proxy
   sends it, so the engine reports its cached tokens;
3. response headers and body: the outcome (`PickOutcome`): the endpoint that served (Envoy's
   `x-gateway-destination-endpoint-served`), TTFT at the first token, usage at the end; the
   client sees the proxy's `x-warmgate-*` headers, and no usage chunk it did not ask for.

What cannot be picked is answered as the protocol says, with an ImmediateResponse Envoy
returns to the client: 503 when no endpoint is ready or none of the subset is, the proxy's
OpenAI-shaped 400/404/413 for a request it would refuse. A failure of the picker itself
ends the stream with a gRPC error: Envoy then applies the InferencePool's `failureMode`
(FailOpen routes by its own load balancing, FailClose answers an error)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

from contracts.errors import InputError
from gateway.config.settings import Settings
from gateway.epp.endpoints import EndpointNames, parse_endpoints
from gateway.epp.outcome import PickOutcome
from gateway.errors import OpenAIError, bad_request, body_too_large
from gateway.fleet.health import HealthChecker
from gateway.json_codec import decode
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.stats import GatewayStats
from gateway.observe.tracing import Tracing
from gateway.pipeline.decide import RequestPipeline
from gateway.pipeline.parse import decode_json_object, parse_chat, parse_completion, upstream_body
from gateway.upstream.sse import SseRelay
from router.router import Router

DESTINATION = "x-gateway-destination-endpoint"
SUBSET = "x-gateway-destination-endpoint-subset"
SERVED = "x-gateway-destination-endpoint-served"
_CHAT_PATHS = ("/v1/chat/completions",)
_COMPLETION_PATHS = ("/v1/completions",)


class EppProtocolError(InputError):
    """Envoy's messages came out of the protocol's order (a misconfigured filter)."""


@dataclass(frozen=True, slots=True)
class PickerParts:
    """What the picker uses of the app (built with it in the lifespan)."""

    settings: Settings
    pipeline: RequestPipeline
    router: Router
    health: HealthChecker
    metrics: GatewayMetrics
    stats: GatewayStats
    tracing: Tracing
    names: EndpointNames


class PickStream:
    """The state of one request's ext_proc stream (`handle` each message in order)."""

    def __init__(self, parts: PickerParts) -> None:
        self.parts = parts
        self.headers: dict[str, str] = {}
        self.metadata: Any = None  # the request's metadata_context (the subset hint)
        self.body = bytearray()
        self.outcome: PickOutcome | None = None
        self.by_name: dict[str, str] = {}  # ip:port -> instance, of this request's pick
        self.relay: SseRelay | None = None
        self.response = bytearray()  # a non-stream response, read for its usage
        self.status = 0
        self.finished = False  # an immediate response ended the exchange

    async def handle(self, message: ep.ProcessingRequest) -> ep.ProcessingResponse:
        kind = message.WhichOneof("request")
        if message.HasField("metadata_context") and self.metadata is None:
            self.metadata = message.metadata_context
        if kind == "request_headers":
            return self._request_headers(message.request_headers)
        if kind == "request_body":
            return await self._request_body(message.request_body)
        if kind == "response_headers":
            return self._response_headers(message)
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "request_trailers":
            return ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
        if kind == "response_trailers":
            return ep.ProcessingResponse(response_trailers=ep.TrailersResponse())
        raise EppProtocolError(f"unexpected ext_proc message {kind!r}")

    def end(self) -> None:
        """The stream closed: a response that never ended was cancelled."""
        if self.outcome is not None:
            self.outcome.complete("cancelled", ok=False)

    # -- the request ------------------------------------------------------------------------

    def _request_headers(self, msg: ep.HttpHeaders) -> ep.ProcessingResponse:
        for h in msg.headers.headers:
            value = h.raw_value.decode("latin-1") if h.raw_value else h.value
            self.headers.setdefault(h.key.lower(), value)
        if msg.end_of_stream:  # nothing to decide on
            return self._immediate(
                bad_request("The endpoint picker routes completion requests with a JSON body.")
            )
        return ep.ProcessingResponse(request_headers=ep.HeadersResponse())

    async def _request_body(self, msg: ep.HttpBody) -> ep.ProcessingResponse:
        if not self.headers:
            raise EppProtocolError("request body before its headers")
        self.body += msg.body
        if len(self.body) > self.parts.settings.max_body_bytes:
            return self._immediate(body_too_large(self.parts.settings.max_body_bytes))
        if not msg.end_of_stream:
            return ep.ProcessingResponse(request_body=ep.BodyResponse())
        try:
            return await self._pick()
        except OpenAIError as err:
            return self._immediate(err)

    async def _pick(self) -> ep.ProcessingResponse:
        parts = self.parts
        started = time.monotonic()
        raw = bytes(self.body)
        body, fast = decode_json_object(raw, parts.settings.request_limits)
        path = self.headers.get(":path", "").split("?", 1)[0]
        chat = path in _CHAT_PATHS or (path not in _COMPLETION_PATHS and "messages" in body)
        parse = parse_chat if chat else parse_completion
        limits = parts.settings.request_limits
        parsed = parse(body, self.headers.get("x-session-id"), raw, fast, limits)
        names = await parts.names.names(parts.health.candidates_for(parsed.model))
        among = set(names)
        subset = self._subset()
        if subset is not None:
            among = {i for i, n in names.items() if n in subset}
        trace = parts.tracing.begin(
            (k.encode(), v.encode("latin-1")) for k, v in self.headers.items()
        )
        routed = await parts.pipeline.decide(parsed, dry_run=False, among=among)
        order = [(i, names[i]) for i in routed.attempt_order() if i in names]
        self.by_name = {n: i for i, n in order}
        value = ",".join(n for _, n in order)
        request_id = self.headers.get("x-request-id") or uuid.uuid4().hex
        trace.decided(routed, path or "/v1/chat/completions")
        self.outcome = PickOutcome(
            parts.router,
            parts.metrics,
            parts.stats,
            trace,
            parsed,
            routed.route,
            routed.decision,
            request_id,
            started,
        )
        parts.pipeline.send_prefetch(routed)
        sent: dict[str, str] = {}
        trace.attempt(routed.decision.instance, 0, sent)  # its traceparent, when traced
        headers = {DESTINATION: value, **sent}
        mutation = None
        forwarded = upstream_body(parsed, False)
        if forwarded != raw:
            mutation = ep.BodyMutation(body=forwarded)
            headers["content-length"] = str(len(forwarded))
        if parsed.stream:
            self.relay = SseRelay(strip_usage=not parsed.client_wants_usage)
        common = ep.CommonResponse(
            header_mutation=_set_headers(headers), body_mutation=mutation, clear_route_cache=True
        )
        metadata = Struct()
        metadata.update({parts.settings.epp.destination_namespace: {DESTINATION: value}})
        return ep.ProcessingResponse(
            request_body=ep.BodyResponse(response=common), dynamic_metadata=metadata
        )

    def _subset(self) -> set[str] | None:
        """The endpoints Envoy offers, if it offers a subset (malformed entries are not
        eligible)."""
        if self.metadata is None:
            return None
        ns = self.parts.settings.epp.subset_namespace
        if ns not in self.metadata.filter_metadata:
            return None
        fields = self.metadata.filter_metadata[ns].fields
        if SUBSET not in fields:
            return None
        out: set[str] = set()
        for value in fields[SUBSET].list_value.values:
            try:
                out.update(parse_endpoints(value.string_value))
            except InputError:
                continue
        return out

    def _immediate(self, err: OpenAIError) -> ep.ProcessingResponse:
        self.finished = True
        outcome = "client_error" if err.status < 500 else "unavailable"
        self.parts.metrics.requests.labels(outcome).inc()
        self.parts.stats.outcomes[outcome] += 1
        headers = {"content-type": "application/json", **err.headers}
        return ep.ProcessingResponse(
            immediate_response=ep.ImmediateResponse(
                status=HttpStatus(code=err.status),
                headers=_set_headers(headers),
                body=json.dumps(err.body()).encode(),
                details=f"warmgate epp: {err.message}"[:200],
            )
        )

    # -- the response -----------------------------------------------------------------------

    def _response_headers(self, message: ep.ProcessingRequest) -> ep.ProcessingResponse:
        outcome = self.outcome
        if outcome is None:
            return ep.ProcessingResponse(response_headers=ep.HeadersResponse())
        served = self._served(message)
        if served is not None:
            outcome.served_by(served)
        content_type = ""
        for h in message.response_headers.headers.headers:
            value = h.raw_value.decode("latin-1") if h.raw_value else h.value
            if h.key == ":status" and value.isdigit():
                self.status = int(value)
            elif h.key.lower() == "content-type":
                content_type = value
        if not content_type.startswith("text/event-stream"):
            self.relay = None
        if self.status >= 400:
            busy = self.status >= 500 or self.status == 429
            outcome.complete("upstream_error" if busy else "client_error", ok=False)
        elif message.response_headers.end_of_stream:
            outcome.complete("ok", ok=True)
        i = outcome.instance
        shown = {
            "x-warmgate-instance": i,
            "x-warmgate-cached-tokens": str(outcome.predicted_for(i)),
            "x-warmgate-policy": outcome.decision.policy,
        }
        common = ep.CommonResponse(header_mutation=_set_headers(shown))
        return ep.ProcessingResponse(response_headers=ep.HeadersResponse(response=common))

    def _served(self, message: ep.ProcessingRequest) -> str | None:
        ns = self.parts.settings.epp.destination_namespace
        if not message.HasField("metadata_context"):
            return None
        if ns not in message.metadata_context.filter_metadata:
            return None
        fields = message.metadata_context.filter_metadata[ns].fields
        if SERVED not in fields:
            return None
        try:
            (name,) = parse_endpoints(fields[SERVED].string_value)[:1]
        except (InputError, ValueError):
            return None
        return self.by_name.get(name)

    def _response_body(self, msg: ep.HttpBody) -> ep.ProcessingResponse:
        outcome = self.outcome
        relay = self.relay
        if outcome is None or outcome.done:
            return ep.ProcessingResponse(response_body=ep.BodyResponse())
        mutation = None
        if relay is not None:
            pieces = relay.feed(msg.body)
            if msg.end_of_stream:
                pieces.append(relay.flush())
            if relay.saw_content:
                outcome.first_token()
            if relay.strip_usage:  # what the client asked for, as the proxy relays it
                mutation = ep.BodyMutation(body=b"".join(pieces))
            if msg.end_of_stream:
                ok = relay.error is None
                outcome.complete("ok" if ok else "upstream_error", ok=ok, usage=relay.usage)
        else:
            if len(self.response) + len(msg.body) <= self.parts.settings.epp.max_response_bytes:
                self.response += msg.body
            if msg.end_of_stream:
                outcome.complete("ok", ok=True, usage=_usage(bytes(self.response)))
        common = ep.CommonResponse(body_mutation=mutation) if mutation is not None else None
        return ep.ProcessingResponse(response_body=ep.BodyResponse(response=common))


def _set_headers(headers: dict[str, str]) -> ep.HeaderMutation:
    overwrite = HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    return ep.HeaderMutation(
        set_headers=[
            HeaderValueOption(
                header=HeaderValue(key=k, raw_value=v.encode("latin-1")), append_action=overwrite
            )
            for k, v in headers.items()
        ]
    )


def _usage(body: bytes) -> dict[str, Any] | None:
    try:
        doc, _ = decode(body)
    except ValueError:
        return None
    usage = doc.get("usage") if isinstance(doc, dict) else None
    return usage if isinstance(usage, dict) else None
