"""A timing profile of the real CPU engine from `bench.simfit_measure`'s samples: the fit
(`sim.fit`) plus what the engine's own configuration says, each figure with where it came
from (the profile's `source`).

What is read rather than fitted:
- the prefill chunk, `max_num_batched_tokens`: vLLM 0.32's default for the OpenAI server on a
  CPU platform, 2048 x world size 1 (`vllm/engine/arg_utils.py`, `get_batch_defaults`, "cpu
  specific default values"); the engines are started without `--max-num-batched-tokens`;
- `max_num_seqs`: 128 from the same table;
- KV capacity: `--num-gpu-blocks-override` 48 x block size 128 (`bench compare --scale
  cpu-overflow`);
- KV bytes per token: 2 (K and V) x layers x KV heads x head dim x 4 bytes (fp32), from the
  model's config.json;
- tier bandwidths: the contracts' defaults (tierd's loads on this machine took 2-5 ms a
  request in the seed-23 breakdown, docs/BENCHMARKS.md; at the defaults a 2,000-token load
  is 1 ms, so they are not what the TTFTs are made of).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.fit import (
    DecodeSample,
    FitInputError,
    LinearFit,
    PrefillSample,
    fit_decode,
    fit_prefill,
    predicted_prefill_s,
    slowdown,
)
from sim.profiles import Profile

VLLM_CPU_MAX_NUM_BATCHED_TOKENS = 2048  # arg_utils.get_batch_defaults, cpu, OPENAI_API_SERVER
VLLM_CPU_MAX_NUM_SEQS = 128  # the same table


@dataclass(frozen=True, slots=True)
class FittedProfile:
    profile: Profile
    prefill: LinearFit
    decode: LinearFit
    paired_slowdown: float  # two engines computing at once against one alone
    details: dict[str, Any]


def merge_measurements(measurements: list[dict[str, Any]]) -> dict[str, Any]:
    """Several measurements of the same engines as one: every phase's samples together (each
    tagged with its measurement), the first one's engine arguments; their replays must be
    of one seed (the busy factor is fitted to all of them at once)."""
    if not measurements:
        raise FitInputError("no measurement to fit")
    seeds = {int(m["replay_seed"]) for m in measurements if m.get("replay_seed") is not None}
    if len(seeds) > 1:
        raise FitInputError(f"the measurements replay different seeds: {sorted(seeds)}")
    phases: dict[str, Any] = {}
    for k, m in enumerate(measurements):
        for name, phase in m["phases"].items():
            rows = phases.setdefault(name, {"samples": [], "metrics_delta": []})
            rows["samples"] += [{**r, "measurement": k} for r in phase["samples"]]
            rows["metrics_delta"] += phase["metrics_delta"]
    first = measurements[0]
    return {
        **first,
        "started_at": ", ".join(m["started_at"] for m in measurements),
        "replay_seed": seeds.pop() if seeds else None,
        "phases": phases,
    }


def kv_bytes_per_token(model_dir: Path) -> int:
    """K and V of every layer, fp32, from the model's config.json."""
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return int(2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4)


def prefill_samples(phases: dict[str, Any]) -> list[PrefillSample]:
    """Lone prompts: the cold ones and the tails after a cached context."""
    rows = list(phases["cold"]["samples"]) + list(phases["cached"]["samples"])
    return [
        PrefillSample(r["prompt_tokens"] - r["cached_tokens"], r["cached_tokens"], r["ttft_s"])
        for r in rows
        if r["prompt_tokens"] > 0
    ]


def decode_samples(phases: dict[str, Any]) -> list[DecodeSample]:
    """Each decode case's step: from the last stream's first token (all of them decode
    together from then on) to the last one's end, over the tokens left."""
    by_case: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in phases["decode"]["samples"]:
        if r["output_tokens"] > 1:
            key = (int(r.get("measurement", 0)), int(r.get("case", r["batch"])))
            by_case.setdefault(key, []).append(r)
    out = []
    for _, rows in sorted(by_case.items()):
        last_first = max(r["ttft_s"] for r in rows)
        step = (max(r["e2e_s"] for r in rows) - last_first) / (rows[0]["output_tokens"] - 1)
        kv = sum(r["prompt_tokens"] + r["output_tokens"] // 2 for r in rows)
        out.append(DecodeSample(len(rows), kv, step))
    return out


def paired_slowdown(phases: dict[str, Any], fit: LinearFit, chunk: int) -> float:
    rows = phases["paired"]["samples"]
    predicted = [
        predicted_prefill_s(fit, r["prompt_tokens"] - r["cached_tokens"], r["cached_tokens"], chunk)
        for r in rows
    ]
    return slowdown([r["ttft_s"] for r in rows], predicted)


def fit_profile(measured: dict[str, Any], model_dir: Path, name: str, where: str) -> FittedProfile:
    """The profile of the measured engine; `where` names the measurement file for `source`."""
    phases = measured["phases"]
    chunk = VLLM_CPU_MAX_NUM_BATCHED_TOKENS
    prefill = fit_prefill(prefill_samples(phases), chunk)
    decode = fit_decode(decode_samples(phases))
    paired = paired_slowdown(phases, prefill, chunk)
    overhead, per_token, attention = prefill.coefficients
    base, per_seq, per_kv = decode.coefficients
    blocks = int(measured["engine_args"]["num_gpu_blocks"])
    block_size = int(measured["engine_args"]["block_size"])
    loads = [r["load_1m"] for p in phases.values() for r in p["samples"]]
    source = (
        f"vllm-cpu 0.32 serving the tiny local model (gateway.launch.models), fp32, -O0, one "
        f"core each, as bench compare --scale cpu-overflow starts it; measured {where} "
        f"({measured['started_at']}, machine load {min(loads):.1f}-{max(loads):.1f} on "
        f"{measured['cpus']} cores) by bench.simfit_measure. Prefill fitted (sim.fit, "
        f"least squares, relative error rms {prefill.rms_relative_error:.3f} over "
        f"{prefill.samples} lone prompts: cold salted prompts as the join probe sends, and "
        f"tails after a cached context): {1000 * overhead:.1f} ms a step + "
        f"{1e6 * per_token:.0f} us a token + {1e9 * attention:.1f} ns a (token, context "
        f"token) pair, in chunks of max_num_batched_tokens {chunk} (vLLM's CPU default, "
        f"arg_utils.get_batch_defaults). Decode fitted on {decode.samples} batches (1-4 "
        f"streams): {1000 * base:.1f} ms a step + {1000 * per_seq:.2f} ms a sequence + "
        f"{1e9 * per_kv:.1f} ns a KV token. Two engines computing at once, six "
        f"paired prompts: {paired:.2f}x the lone time (shared_core_slowdown, unless a replay "
        f"calibrates it). max_num_seqs "
        f"{VLLM_CPU_MAX_NUM_SEQS} (CPU default); KV {blocks} blocks x {block_size} "
        f"(--num-gpu-blocks-override); KV bytes/token from config.json (fp32); tier "
        f"bandwidths the contracts' defaults"
    )
    profile = Profile(
        name=name,
        source=source,
        kv_bytes_per_token=kv_bytes_per_token(model_dir),
        prefill_overhead_s=overhead,
        prefill_per_token_s=per_token,
        prefill_attention_s=attention,
        step_base_s=base,
        step_per_seq_s=per_seq,
        step_per_kv_token_s=per_kv,
        kv_capacity_tokens=blocks * block_size,
        max_batch_tokens=chunk,
        max_num_seqs=VLLM_CPU_MAX_NUM_SEQS,
        shared_core_slowdown=max(1.0, paired),
    )
    details = {
        "prefill_rms_relative_error": prefill.rms_relative_error,
        "decode_rms_relative_error": decode.rms_relative_error,
        "paired_slowdown": paired,
        "machine_load_1m": [min(loads), statistics.median(loads), max(loads)],
        "engine_histograms": {k: v["metrics_delta"] for k, v in phases.items()},
    }
    return FittedProfile(profile, prefill, decode, paired, details)
