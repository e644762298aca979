"""The join probe: price an instance at its real speed before the first routed request
lands on it (issue 24, item 1).

When an instance becomes healthy (configured at startup, added at runtime through the admin
API, or back after a restart: any move to healthy from another state), the gateway sends it
`calibration.probe_tokens` cold prompts, one after another, straight to the engine (not
through the proxy: they are no client's requests and count in no statistic):

- each a chat completion with `max_tokens` 1 and its own `cache_salt` (vLLM's body field,
  which the simulated engine honours too), so it reuses nothing and nothing reuses it;
- after one short warm-up prompt, not timed (a fresh connection, and an engine's first
  request, are slower than what follows: measured, they would bend the fitted curve);
- each timed from send to answer (with one output token, that is its time to first token)
  and sized by the engine's `usage.prompt_tokens` (else the gateway's estimate);
- all of them within `calibration.probe_timeout_s`; what was measured by then counts, and a
  prompt predicted to run past it is not sent (gateway/fleet/probe_plan.py: the engine would
  go on with it after the gateway gave up, and the first routed requests would wait).

The samples go to the policy (`Policy.calibrate(instance, samples)`; ttft's cost model
fits its speed on them at once, router/cost.py). While its probe runs the instance is kept
out of every candidate set, as long as another candidate remains (a fleet with nothing
else to route to is never stalled); at startup the lifespan waits for the first probes
(`settled`, bounded by the timeout) before serving. A probe that fails or times out only
ends early: the instance joins all the same, priced by the prior and its outcomes.
`calibration.probe: false` turns all of it off.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence

import httpx

from gateway.config.settings import CalibrationSettings
from gateway.fleet import probe_plan
from gateway.fleet.health import HealthChecker, HealthState, ModelListError
from gateway.lifetime import Lifetime
from router.policies.base import CalibrationSample, Policy

log = logging.getLogger("warmgate.calibration")

# Common English words, one token each in the usual BPE vocabularies: a prompt of n of them
# is about n tokens (the engine's usage says exactly)
_TEXT = (
    "the stone gate opens onto a road that runs north past the old mill and the river "
    "where traders wait for the ferry at dawn with salt wool and iron"
)
_WORDS = tuple(_TEXT.split(" "))


WARM_UP_TOKENS = 16  # the untimed first prompt


def probe_prompt(tokens: int) -> str:
    """About `tokens` tokens of plain text."""
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(max(1, tokens)))


def probe_body(model: str, tokens: int) -> dict[str, object]:
    """One probe request: cold (a salt of its own), one output token."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": probe_prompt(tokens)}],
        "max_tokens": 1,
        "temperature": 0,
        "stream": False,
        "cache_salt": f"warmgate-probe-{uuid.uuid4().hex}",
    }


class CalibrationProbe:
    """Probes instances as they join and keeps them out of the candidates meanwhile."""

    def __init__(
        self,
        settings: CalibrationSettings,
        health: HealthChecker,
        policy: Policy,
        client: httpx.AsyncClient,
        life: Lifetime,
        *,
        chars_per_token: int = 4,
    ) -> None:
        self._settings = settings
        self._health = health
        self._policy = policy
        self._client = client
        self._life = life
        self._chars_per_token = chars_per_token
        self._running: dict[str, asyncio.Task[list[CalibrationSample]]] = {}
        self.probes = 0  # probes finished (timed out or failed ones included)
        self.last: dict[str, list[CalibrationSample]] = {}  # each instance's latest samples

    @property
    def probing(self) -> set[str]:
        return set(self._running)

    def on_health(self, instance: str, old: HealthState, new: HealthState) -> None:
        """A health listener: an instance that becomes healthy is probed (again)."""
        if new != "healthy" or old == "healthy":
            return
        running = self._running.get(instance)
        if running is not None:
            running.cancel()
        self._running[instance] = self._life.spawn(self._probe(instance), f"probe-{instance}")

    def keep(self, candidates: list[str]) -> list[str]:
        """A candidate filter: instances still being probed sit out while others remain."""
        if not self._running:
            return candidates
        rest = [c for c in candidates if c not in self._running]
        return rest or candidates

    async def settled(self) -> None:
        """Wait for the probes running now (each bounded by the probe timeout)."""
        tasks = list(self._running.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _probe(self, instance: str) -> list[CalibrationSample]:
        samples: list[CalibrationSample] = []
        try:
            async with asyncio.timeout(self._settings.probe_timeout_s):
                await self._measure(instance, samples, time.perf_counter())
        except TimeoutError:
            log.warning(
                "calibration probe of %s timed out after %g s (%d of %d prompts measured)",
                instance,
                self._settings.probe_timeout_s,
                len(samples),
                len(self._settings.probe_tokens),
            )
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("calibration probe of %s failed: %r", instance, exc)
        finally:
            if self._running.get(instance) is asyncio.current_task():
                del self._running[instance]
            self.probes += 1
        if samples and self._health.spec(instance) is not None:
            self.last[instance] = samples
            self._policy.calibrate(instance, samples)
            log.info(
                "calibrated %s: %s",
                instance,
                ", ".join(f"{s.prompt_tokens} tokens {s.ttft_s:.3f} s" for s in samples),
            )
        return samples

    async def _measure(
        self, instance: str, samples: list[CalibrationSample], started_probe: float
    ) -> None:
        models = self._health.models_of(instance)
        if not models:
            raise ModelListError("no model known for the instance")
        base = self._health.instance_url(instance)
        url = f"{base}/v1/chat/completions"
        limit = await self._max_model_len(base, models[0])
        warm_body = probe_body(models[0], WARM_UP_TOKENS)
        warm = await self._client.post(url, json=warm_body)
        warm.raise_for_status()
        # the engine's tokens per probe word (chat template included, so an overestimate):
        # a size that would not fit the engine's context is skipped, not sent to be refused
        per_word = max(1.0, self._prompt_tokens(warm, warm_body) / WARM_UP_TOKENS)
        for tokens in self._settings.probe_tokens:
            elapsed = time.perf_counter() - started_probe
            if not probe_plan.fits(samples, tokens, elapsed, self._settings.probe_timeout_s):
                log.info(
                    "calibration probe of %s: %d tokens skipped (predicted %.1f s, %.1f s of "
                    "the %g s budget left)",
                    instance,
                    tokens,
                    probe_plan.predicted_s(samples, tokens) or 0.0,
                    self._settings.probe_timeout_s - elapsed,
                    self._settings.probe_timeout_s,
                )
                continue
            if limit is not None and tokens * per_word + 1 > limit:
                log.info(
                    "calibration probe of %s: %d tokens skipped (max_model_len %d)",
                    instance,
                    tokens,
                    limit,
                )
                continue
            body = probe_body(models[0], tokens)
            started = time.perf_counter()
            r = await self._client.post(url, json=body)
            elapsed = time.perf_counter() - started
            if r.status_code == 400:  # this size refused (too long, say): the others count
                log.warning(
                    "calibration probe of %s: %d tokens refused: %s", instance, tokens, r.text
                )
                continue
            r.raise_for_status()
            samples.append(CalibrationSample(self._prompt_tokens(r, body), elapsed))

    async def _max_model_len(self, base: str, model: str) -> int | None:
        """The context length the engine reports for the model on `/v1/models` (vLLM's
        `max_model_len`), or None when it reports none."""
        r = await self._client.get(f"{base}/v1/models")
        r.raise_for_status()
        data = r.json().get("data")
        for card in data if isinstance(data, list) else []:
            if isinstance(card, dict) and card.get("id") == model:
                n = card.get("max_model_len")
                return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
        return None

    def _prompt_tokens(self, r: httpx.Response, body: dict[str, object]) -> int:
        try:
            n = r.json()["usage"]["prompt_tokens"]
            if isinstance(n, int) and n > 0:
                return n
        except (ValueError, KeyError, TypeError):
            pass
        messages: Sequence[dict[str, str]] = body["messages"]  # type: ignore[assignment]
        return max(1, -(-len(messages[0]["content"]) // self._chars_per_token))


def start_calibration_probe(
    settings: CalibrationSettings,
    health: HealthChecker,
    policy: Policy,
    client: httpx.AsyncClient,
    life: Lifetime,
    *,
    chars_per_token: int = 4,
) -> CalibrationProbe | None:
    """The join probe, listening to health changes and filtering candidates; None when
    `calibration.probe` is off."""
    if not settings.probe:
        return None
    probe = CalibrationProbe(
        settings, health, policy, client, life, chars_per_token=chars_per_token
    )
    health.listeners.append(probe.on_health)
    health.candidate_filters.append(probe.keep)
    return probe
