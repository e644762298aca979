"""Checks an instance before it joins the fleet at runtime, so a typo or a mismatched engine
is refused at the admin call instead of failing players' requests later.

- reachable: its `/health` answers 200;
- models: its `/v1/models` serves at least one model, and every model the request names;
- precise mode only: its `vllm:cache_config_info` says the block size and block hash the
  gateway cuts and hashes with (`routing.precise`), and that prefix caching is on. An
  engine that does not publish it is refused: its blocks could not be checked. The hash
  seed (the engines' `PYTHONHASHSEED`) is not published; when the instance names its KV
  events endpoint it is checked by experiment (`gateway.fleet.seed`), else not at all;
- its tierd, when named: `/livez` answers 200.
"""

from __future__ import annotations

import httpx

from gateway.config.settings import InstanceSettings, RoutingSettings
from gateway.fleet.checks import Check, ValidationFailedError
from gateway.fleet.kv_capacity import cache_config_labels
from gateway.fleet.seed import check_hash_seed


async def _get(client: httpx.AsyncClient, url: str, timeout_s: float) -> httpx.Response | str:
    try:
        return await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _models(resp: httpx.Response) -> list[str]:
    try:
        data = resp.json().get("data")
    except (ValueError, AttributeError):
        return []
    if not isinstance(data, list):
        return []
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


def _precise_checks(labels: dict[str, str] | None, routing: RoutingSettings) -> list[Check]:
    if labels is None:
        why = "publishes no vllm:cache_config_info: its block size and hash cannot be checked"
        return [Check("block_size", False, why)]
    p = routing.precise
    out = []
    size = labels.get("block_size")
    out.append(
        Check(
            "block_size",
            size == str(p.effective_block_size),
            f"engine {size}, gateway routing.precise.block_size {p.effective_block_size}",
        )
    )
    if p.hash == "vllm":
        algo = labels.get("prefix_caching_hash_algo")
        out.append(
            Check(
                "hash_algo",
                algo == p.vllm_hash_algo,
                f"engine {algo}, gateway routing.precise.vllm_hash_algo {p.vllm_hash_algo}",
            )
        )
    caching = labels.get("enable_prefix_caching")
    on = caching in (None, "True", "true")
    out.append(Check("prefix_caching", on, f"enable_prefix_caching={caching}"))
    return out


async def validate_instance(
    client: httpx.AsyncClient,
    spec: InstanceSettings,
    routing: RoutingSettings,
    timeout_s: float,
) -> list[Check]:
    """Every check's outcome; raises `ValidationFailedError` when one failed."""
    checks: list[Check] = []
    health = await _get(client, f"{spec.url}/health", timeout_s)
    if isinstance(health, str) or health.status_code != 200:
        detail = health if isinstance(health, str) else f"/health answered {health.status_code}"
        raise ValidationFailedError([Check("reachable", False, f"{spec.url}: {detail}")])
    checks.append(Check("reachable", True, f"{spec.url}/health answered 200"))

    models_resp = await _get(client, f"{spec.url}/v1/models", timeout_s)
    served = _models(models_resp) if isinstance(models_resp, httpx.Response) else []
    missing = sorted(set(spec.models) - set(served))
    if not served:
        checks.append(Check("models", False, "its /v1/models lists no model"))
    elif missing:
        checks.append(Check("models", False, f"does not serve {missing}; it serves {served}"))
    else:
        checks.append(Check("models", True, f"serves {served}"))

    if routing.mode == "precise":
        metrics = await _get(client, f"{spec.url}/metrics", timeout_s)
        text = metrics.text if isinstance(metrics, httpx.Response) and metrics.is_success else ""
        checks.extend(_precise_checks(cache_config_labels(text), routing))
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
