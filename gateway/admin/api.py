"""Admin REST: what the gateway believes and why.

- `GET /admin/instances`: each instance's health (state and why), load, cached tokens the
  index believes it holds, and its tierd's last stats;
- `GET /admin/stats`: cluster totals (requests by outcome, predicted vs reported cached
  tokens, TTFT p50/p99 over the sliding window) plus the router's own counters;
- `GET /admin/sessions/{key}`: where a player's KV is believed to be, by tier, and why;
- `GET` or `POST /admin/route/explain`: a dry run of routing on a completion request body: every
  candidate's view (cached tokens by tier, load, predicted TTFT and its parts, and the
  policy's score term by term), the choice, the reason and the fallbacks. Nothing is sent
  and nothing changes: not the load view, index or sessions, nor the policy's own state
  (`Router.explain` asks the policy for a `preview`), so the next real decision is the one
  it would have been.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.pipeline.parse import parse_chat, parse_completion, parse_json_object, read_body
from gateway.state import app_state


def build_admin_router() -> APIRouter:
    router = APIRouter(prefix="/admin")

    @router.get("/instances")
    async def instances(request: Request) -> JSONResponse:
        state = app_state(request)
        block_tokens = state.settings.routing.index_block_tokens
        fleet = state.fleet
        loads = state.engine_load  # gateway.fleet.engine_load: what the engines say
        out: list[dict[str, Any]] = []
        for inst in state.health.instances():  # the fleet now (gateway.fleet.runtime changes it)
            in_flight, queued = state.router.load.view(inst.id)
            blocks = state.router.index.blocks_held(inst.id)
            out.append(
                {
                    "id": inst.id,
                    "url": inst.url,
                    "tierd_url": inst.tierd_url,
                    "models": state.health.models_of(inst.id),
                    "health": state.health.health[inst.id].to_dict(),
                    "fleet": fleet.status_of(inst.id) if fleet is not None else None,
                    "in_flight": in_flight,
                    "local_in_flight": state.router.load.local_in_flight(inst.id),
                    "queued_prefill_tokens": queued,
                    "cached_blocks_believed": blocks,
                    "cached_tokens_believed": blocks * block_tokens,
                    "tierd_stats": state.tier_stats.get(inst.id),
                    "engine": loads.view(inst.id) if loads is not None else None,
                }
            )
        return JSONResponse({"instances": out})

    @router.get("/stats")
    async def stats(request: Request) -> JSONResponse:
        state = app_state(request)
        loads = state.engine_load
        return JSONResponse(
            {
                **state.stats.to_dict(),
                "healthy_instances": len(state.health.healthy_ids()),
                "router": state.router.stats(),
                # the engines' own accounting, beside warmgate's predicted-vs-reported
                "engine_reported": loads.reported() if loads is not None else None,
                "warm": state.warmer.stats() if state.warmer is not None else None,
            }
        )

    @router.get("/sessions/{key:path}")  # session keys may contain slashes
    async def session(key: str, request: Request) -> JSONResponse:
        state = app_state(request)
        where = state.router.where(key)
        binder = state.bindings
        binding = await binder.binding_of(key) if binder is not None else None
        bound = binding.get("bound_instance") if binding else None
        if binding is not None:
            where["binding"] = binding
        if where.get("known"):
            where["why"] = (
                f"last routed here to {where.get('last_instance')} ({where.get('last_reason')}); "
                "per-instance tokens are the leading run of its last prompt's blocks "
                "the index holds, by tier"
                + (f"; the shared session binding says {bound}" if bound else "")
            )
        elif bound:
            where["why"] = f"not routed by this replica; the shared session binding says {bound}"
        else:
            where["why"] = "no request with this session key has been routed by this gateway"
        return JSONResponse(where, status_code=200 if where.get("known") or bound else 404)

    # GET as the issue names it (a body on GET is legal, if unusual), POST for clients that
    # will not send one
    @router.get("/route/explain", operation_id="route_explain_get")
    @router.post("/route/explain", operation_id="route_explain_post")
    async def explain(request: Request) -> JSONResponse:
        state = app_state(request)
        settings = state.settings
        raw = await read_body(request, settings.max_body_bytes, settings.server.body_timeout_s)
        limits = settings.request_limits
        body = parse_json_object(raw, limits)
        session_header = request.headers.get("x-session-id")
        parsed = (
            parse_completion(body, session_header, limits=limits)
            if "prompt" in body and "messages" not in body
            else parse_chat(body, session_header, limits=limits)
        )
        assert state.pipeline is not None, "built in the lifespan"
        routed = await state.pipeline.decide(parsed, dry_run=True)  # the proxy's own path
        rr, decision, candidates = routed.route, routed.decision, routed.candidates
        excluded = {
            i: state.health.health[i].to_dict()
            for i in state.health.health
            if i not in candidates and parsed.model in state.health.models_of(i)
        }
        return JSONResponse(
            {
                "request": {
                    "mode": state.settings.routing.mode,
                    "model": parsed.model,
                    "session_key": parsed.session_key,
                    "prompt_tokens": rr.prompt_tokens,
                    "blocks": len(rr.block_hashes),
                    "block_tokens": rr.block_tokens,
                },
                "decision": {
                    "instance": decision.instance,
                    "policy": decision.policy,
                    "reason": decision.reason,
                    "cached_tokens": decision.cached_tokens,
                    "cached_tokens_by_tier": decision.cached_tokens_by_tier,
                    "predicted_ttft_s": decision.predicted_ttft_s,
                    "fallbacks": list(decision.fallbacks),
                },
                "binding": {
                    "outcome": routed.binding,  # None: bindings do not apply here
                    "bound_instance": routed.bound_instance,
                    "policy_chose": routed.policy_choice,
                },
                "prefetch": None
                if routed.prefetch is None
                else {"instance": routed.prefetch.instance, "blocks": len(routed.prefetch.chain)},
                "candidates": [dataclasses.asdict(c) for c in decision.candidates],
                "excluded": excluded,
            }
        )

    return router
