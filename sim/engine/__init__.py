"""sim.engine: a simulated, OpenAI-compatible inference engine that behaves like vLLM.

It serves chat and text completions (plain and streamed) with deterministic text, schedules
requests with continuous batching and chunked prefill, charges time from a named timing
profile (`sim.profiles`), keeps a prefix cache of KV blocks hashed as vLLM hashes them,
exposes vLLM's metric names and can publish vLLM KV events. `python -m sim.engine --help`.
"""

from sim.engine.app import create_app
from sim.engine.config import DEFAULT_MODEL, EngineConfig, parse_config

__all__ = ["DEFAULT_MODEL", "EngineConfig", "create_app", "parse_config"]
