"""Checks an instance before it joins the fleet at runtime, so a typo or a mismatched engine
is refused at the admin call instead of failing players' requests later.

- reachable: its health route (`/health`) answers 200;
- models: its models route (`/v1/models`) serves at least one model, and every model the
  request names;
- precise mode only: its cache config (vLLM's `vllm:cache_config_info`) says the block size
  and block hash the gateway cuts and hashes with (`routing.precise`), and that prefix
  caching is on. An engine that does not publish it is refused: its blocks could not be
  checked. The hash seed (vLLM's `PYTHONHASHSEED`) is not published; when the instance names
  its KV events endpoint it is checked by experiment (`gateway.fleet.seed`), else not at all;
- its tierd, when named: `/livez` answers 200.

Routes, pages and answers are read through the instance's engine kind (`spec.adapter`,
`gateway.engine.base.Engine`).
"""

from __future__ import annotations

import httpx

from gateway.config.settings import InstanceSettings, RoutingSettings
from gateway.engine.base import Engine, EngineCacheConfig
from gateway.fleet.checks import Check, ValidationFailedError
from gateway.fleet.seed import check_hash_seed


async def _get(client: httpx.AsyncClient, url: str, timeout_s: float) -> httpx.Response | str:
    try:
        return await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _models(engine: Engine, resp: httpx.Response) -> list[str]:
    try:
        answer = resp.json()
    except ValueError:
        return []
    return engine.served_models(answer) or []


def _precise_checks(
    engine: Engine, config: EngineCacheConfig | None, routing: RoutingSettings
) -> list[Check]:
    if config is None:
        why = (
            f"publishes no {engine.metric_names.cache_config}: its block size and hash "
            "cannot be checked"
        )
        return [Check("block_size", False, why)]
    p = routing.precise
    out = []
    size = config.block_size
    out.append(
        Check(
            "block_size",
            size == p.effective_block_size,
            f"engine {size}, gateway routing.precise.block_size {p.effective_block_size}",
        )
    )
    if p.hash == "vllm":
        algo = config.hash_algo
        out.append(
            Check(
                "hash_algo",
                algo == p.vllm_hash_algo,
                f"engine {algo}, gateway routing.precise.vllm_hash_algo {p.vllm_hash_algo}",
            )
        )
    on = config.prefix_caching is not False
    out.append(Check("prefix_caching", on, f"enable_prefix_caching={config.prefix_caching}"))
    return out


async def validate_instance(
    client: httpx.AsyncClient,
    spec: InstanceSettings,
    routing: RoutingSettings,
    timeout_s: float,
) -> list[Check]:
    """Every check's outcome; raises `ValidationFailedError` when one failed."""
    checks: list[Check] = []
    engine = spec.adapter
    path = engine.health_path
    health = await _get(client, f"{spec.url}{path}", timeout_s)
    if isinstance(health, str) or health.status_code != 200:
        detail = health if isinstance(health, str) else f"{path} answered {health.status_code}"
        raise ValidationFailedError([Check("reachable", False, f"{spec.url}: {detail}")])
    checks.append(Check("reachable", True, f"{spec.url}{path} answered 200"))

    models_resp = await _get(client, f"{spec.url}{engine.models_path}", timeout_s)
    served = _models(engine, models_resp) if isinstance(models_resp, httpx.Response) else []
    missing = sorted(set(spec.models) - set(served))
    if not served:
        checks.append(Check("models", False, "its /v1/models lists no model"))
    elif missing:
        checks.append(Check("models", False, f"does not serve {missing}; it serves {served}"))
    else:
        checks.append(Check("models", True, f"serves {served}"))

    if routing.mode == "precise":
        metrics = await _get(client, f"{spec.url}{engine.metrics_path}", timeout_s)
        text = metrics.text if isinstance(metrics, httpx.Response) and metrics.is_success else ""
        checks.extend(_precise_checks(engine, engine.cache_config(text), routing))
        if served and all(c.ok for c in checks):
            seed = await check_hash_seed(client, spec, routing, served[0], timeout_s)
            if seed is not None:
                checks.append(seed)

    if spec.tierd_url:
        livez = await _get(client, f"{spec.tierd_url}/livez", timeout_s)
        ok = isinstance(livez, httpx.Response) and livez.status_code == 200
        detail = f"{spec.tierd_url}/livez " + (
            livez if isinstance(livez, str) else f"answered {livez.status_code}"
        )
        checks.append(Check("tierd", ok, detail))

    if not all(c.ok for c in checks):
        raise ValidationFailedError(checks)
    return checks
