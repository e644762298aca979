"""`TierdConnector`: vLLM's v1 KV connector backed by the tierd beside the engine.

Scheduler side (EngineCore process): for a new request, asks tierd (one round trip on the
KV socket) how many leading blocks past vLLM's own prefix cache it holds, keyed by
`request.block_hashes`; records which engine blocks to fill and which newly completed
blocks to save each step (`tierd.connector.plan`). Worker side: loads before the forward
pass (or, with ``"load": "async"``, in a thread while the request waits in
WAITING_FOR_REMOTE_KVS), saves after it by one copy into reserved L1 slots and a one-way
commit (tierd checksums and writes through to the shared array on its own time). Any
failure — a slice missing, corrupt, or tierd gone — is reported as failed blocks, and with
``kv_load_failure_policy: recompute`` vLLM recomputes them; nothing is ever guessed.

Extra config: ``socket`` (tierd's KV socket, required), ``load`` (``sync`` | ``async``),
``lookup`` (``sync``: one blocking round trip on the scheduler loop; ``async``: in a thread,
answering vLLM "not yet" (None) until it is back, so a slow tierd never stalls the loop),
``lookup_reuse_ms`` (500: a waiting request asked about again within it gets the same
answer without a round trip; 0 asks every time),
``save`` (``async``, the default: `tierd.connector.saver`, off the critical path;
``sync``: in `wait_for_save`), ``stats_dir`` (JSON counters: ``scheduler-<pid>.json``,
``worker-<pid>.json``),
``namespace`` (override; default: model, dtype, block size, hash algorithm, hash seed).

With vLLM's tracing on, a traced request's lookup, load and save are spans in its trace
(`tierd.connector.tracing`).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from tierd.connector import plan as P
from tierd.connector.saver import AsyncSaver
from tierd.connector.tracing import Carrier, ConnectorTracing, now_ns
from tierd.connector.worker import BlockMover, Link, log, write_stats
from tierd.kvwire import KvSocketError

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

RTT_SAMPLES = 2048
SOURCES = {"host": CacheHitSource.HOST, "disk": CacheHitSource.DISK}


@dataclass
class TierdConnectorMeta(KVConnectorMetadata):
    """One step's work for the workers."""

    loads: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)
    saves: list[tuple[int, int, int | None]] = field(default_factory=list)
    fresh_blocks: set[int] = field(default_factory=set)  # handed out this step (saver)
    traces: dict[str, Carrier] = field(default_factory=dict)  # traced loads' requests
    save_traces: list[tuple[Carrier, int]] = field(default_factory=list)  # (trace, blocks)


def namespace_of(vllm_config: VllmConfig) -> str:
    """What must agree for two engines' block hashes and KV bytes to mean the same thing."""
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    parts = [
        str(mc.model),
        str(mc.dtype),
        str(cc.block_size),
        str(cc.cache_dtype),
        str(cc.prefix_caching_hash_algo),
        os.environ.get("PYTHONHASHSEED", "unset"),
    ]
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return f"{Path(str(mc.model)).name}-b{cc.block_size}-{digest}"


class TierdConnector(KVConnectorBase_V1):
    """See the module docstring."""

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped save is a future miss

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.socket = str(extra["socket"])
        self.async_load = str(extra.get("load", "sync")) == "async"
        async_lookup = str(extra.get("lookup", "sync")) == "async"
        self.async_save = str(extra.get("save", "async")) == "async"
        self.namespace = str(extra.get("namespace") or namespace_of(vllm_config))
        self.block_size = int(vllm_config.cache_config.block_size)
        stats_dir = extra.get("stats_dir")
        side = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        self.stats_file = Path(stats_dir) / f"{side}-{os.getpid()}.json" if stats_dir else None
        if self.stats_file is not None:
            self.stats_file.parent.mkdir(parents=True, exist_ok=True)
        self.counters: Counter[str] = Counter()
        self.tracing = ConnectorTracing(side)
        # scheduler side
        self._reqs: dict[str, Request] = {}
        self._plans: dict[str, P.ReqPlan] = {}
        self._keys: dict[str, list[int]] = {}
        self._pending: dict[str, list[tuple[int, int]]] = {}
        self._rtt_us: deque[float] = deque(maxlen=RTT_SAMPLES)
        self.link = Link(self.socket, self.namespace, side, self.counters)
        self._lookup_lock = threading.Lock()  # the link is used by one thread at a time
        self._lookup_pool: ThreadPoolExecutor | None = None
        if async_lookup and role == KVConnectorRole.SCHEDULER:
            self._lookup_pool = ThreadPoolExecutor(1, thread_name_prefix="tierd-lookup")
        self._memo = P.LookupMemo(float(extra.get("lookup_reuse_ms", 500)) / 1000)
        self._lookups: dict[
            str, tuple[tuple[int, int], int, Future[tuple[int, dict[str, int]]]]
        ] = {}  # rid -> (window, asked at ns, answer)
        # worker side
        self.mover: BlockMover | None = None
        self.saver: AsyncSaver | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._recving: dict[str, tuple[Future[set[int]], list[int]]] = {}
        self._errors: set[int] = set()
        log.info("tierd connector (%s) namespace %s via %s", side, self.namespace, self.socket)

    # ==== scheduler side ====================================================================

    def _keys_of(self, request: Request) -> list[int]:
        keys = self._keys.setdefault(request.request_id, [])
        hashes = request.block_hashes
        if len(keys) < len(hashes):
            keys.extend(P.block_key(h) for h in hashes[len(keys) :])
        return keys

    def on_new_request(self, request: Request) -> None:
        self._reqs[request.request_id] = request

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        rid = request.request_id
        self._reqs[rid] = request
        plan = self._plans.get(rid)
        if plan is not None and plan.loading:
            return 0, False
        keys = self._keys_of(request)
        start, stop = P.lookup_window(request.num_tokens, num_computed_tokens, self.block_size)
        plan = P.ReqPlan(rid, local_blocks=start, saved_upto=start)
        self._plans[rid] = plan
        if stop <= start or request.skip_reading_prefix_cache:
            return 0, False
        window = (start, stop)
        known = self._memo.get(rid, window, time.monotonic())
        if known is not None:  # asked again while it waits: no second round trip
            self.counters["lookups_reused"] += 1
            plan.ext_blocks, plan.tiers = known.blocks, known.tiers
            return known.blocks * self.block_size, self.async_load and known.blocks > 0
        if self._lookup_pool is None:
            asked_ns = now_ns()
            n, tiers = self._lookup(keys[start:stop], rid)
        else:  # off the scheduler loop: vLLM asks again next step while we return None
            pending = self._lookups.get(rid)
            if pending is None or pending[0] != window:
                fut = self._lookup_pool.submit(self._lookup, keys[start:stop], rid)
                self._lookups[rid] = (window, now_ns(), fut)
                self.counters["lookups_deferred"] += 1
                return None, False
            if not pending[2].done():
                return None, False
            del self._lookups[rid]
            asked_ns = pending[1]
            n, tiers = pending[2].result()
        plan.ext_blocks, plan.tiers = n, tiers
        self._memo.put(rid, P.LookupAnswer(window, n, tiers, time.monotonic()))
        self.tracing.record(
            "tierd lookup",
            self.tracing.carrier_of(request.trace_headers),
            asked_ns,  # async: from the first ask to the answer vLLM acts on
            now_ns(),
            {
                "tierd.lookup.mode": "sync" if self._lookup_pool is None else "async",
                "tierd.blocks_asked": stop - start,
                "tierd.hit_blocks": n,
                **{f"tierd.tier.{name}": count for name, count in tiers.items()},
            },
        )
        return n * self.block_size, self.async_load and n > 0

    def _lookup(self, hashes: list[int], request_id: str) -> tuple[int, dict[str, int]]:
        """One round trip: the leading run tierd holds and its split by tier ((0, {}) when
        tierd cannot answer: the engine computes). The request's id lets tierd tell vLLM's
        retries of a waiting request from new asks."""
        with self._lookup_lock:
            if self.link.get() is None:
                self.counters["lookup_unavailable"] += 1
                return 0, {}
            t0 = time.perf_counter()
            try:
                _, answer = self.link.call({"op": "lookup", "hashes": hashes, "req": request_id})
            except KvSocketError:
                self.counters["lookup_errors"] += 1
                return 0, {}
            self._rtt_us.append((time.perf_counter() - t0) * 1e6)
            n = int(answer["n"])
            self.counters["lookups"] += 1
            self.counters["lookup_hit_blocks"] += n
            if len(self._rtt_us) % 64 == 0:
                self._write_stats()
            return n, dict(answer.get("tiers") or {})

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        plan = self._plans.get(request.request_id)
        if plan is None or num_external_tokens == 0:
            return {}
        split = P.hit_sources(plan, num_external_tokens, self.block_size)
        return {SOURCES[k]: v for k, v in split.items()}

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        plan = self._plans.get(request.request_id)
        if plan is None or num_external_tokens == 0 or plan.loading:
            return
        n = num_external_tokens // self.block_size
        block_ids = blocks.get_block_ids()[0]
        self._pending[request.request_id] = P.load_pairs(plan, self._keys_of(request), block_ids, n)
        plan.ext_blocks = n
        plan.saved_upto = plan.local_blocks + n
        plan.loading = self.async_load
        self.counters["load_requests"] += 1
        self.counters["load_planned_blocks"] += n

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = TierdConnectorMeta(loads=list(self._pending.items()))
        self._pending.clear()
        if self.tracing.enabled:
            for rid, _ in meta.loads:
                req = self._reqs.get(rid)
                carrier = self.tracing.carrier_of(req.trace_headers if req else None)
                if carrier is not None:
                    meta.traces[rid] = carrier
        so = scheduler_output
        for _, pairs in meta.loads:
            meta.fresh_blocks.update(b for _, b in pairs)
        for nr in so.scheduled_new_reqs:
            meta.fresh_blocks.update(nr.block_ids[0] if nr.block_ids else ())
            plan = self._plans.get(nr.req_id)
            req = self._reqs.get(nr.req_id)
            if plan is None or req is None:
                continue
            plan.loading = False
            plan.block_ids = list(nr.block_ids[0])
            plan.saved_upto = max(plan.saved_upto, nr.num_computed_tokens // self.block_size)
            done = nr.num_computed_tokens + so.num_scheduled_tokens.get(nr.req_id, 0)
            self._add_saves(meta, req, P.due_saves(plan, self._keys_of(req), done, self.block_size))
        cached = so.scheduled_cached_reqs
        for new_ids in cached.new_block_ids:  # every request's, planned or not
            meta.fresh_blocks.update(new_ids[0] if new_ids else ())
        for i, rid in enumerate(cached.req_ids):
            plan = self._plans.get(rid)
            req = self._reqs.get(rid)
            if plan is None or req is None:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:
                plan.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                plan.block_ids.extend(new_ids[0])
            done = cached.num_computed_tokens[i] + so.num_scheduled_tokens.get(rid, 0)
            self._add_saves(meta, req, P.due_saves(plan, self._keys_of(req), done, self.block_size))
        self.counters["save_planned_blocks"] += len(meta.saves)
        return meta

    def _add_saves(
        self, meta: TierdConnectorMeta, request: Request, saves: list[tuple[int, int, int | None]]
    ) -> None:
        meta.saves += saves
        carrier = self.tracing.carrier_of(request.trace_headers) if saves else None
        if carrier is not None:
            meta.save_traces.append((carrier, len(saves)))

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        for d in (self._reqs, self._plans, self._keys, self._pending, self._lookups):
            d.pop(rid, None)
        self._memo.drop(rid)
        return False, None

    def _write_stats(self) -> None:
        if self.stats_file is None:
            return
        out = Counter(self.counters)
        if self._rtt_us:
            ordered = sorted(self._rtt_us)
            out["lookup_rtt_p50_us"] = int(ordered[len(ordered) // 2])
            out["lookup_rtt_p99_us"] = int(ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)])
            out["lookup_rtt_samples"] = len(ordered)
        write_stats(self.stats_file, out)

    def take_events(self) -> Any:
        self._write_stats()  # once per engine step: cheap, and the counters stay current
        return ()

    # ==== worker side =======================================================================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.mover = BlockMover(
            kv_caches,
            self._kv_cache_config.num_blocks,
            self.socket,
            self.namespace,
            self.counters,
            str(self.stats_file) if self.stats_file else None,
        )
        if self.async_load:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="tierd-load")
        if self.async_save:
            self.saver = AsyncSaver(self.mover, self.counters)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        meta = kv_connector_metadata  # first thing in a step: no block is written before
        if self.saver is not None and isinstance(meta, TierdConnectorMeta):
            self.saver.before_writes(meta.fresh_blocks)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TierdConnectorMeta)
        if self.mover is None:
            return
        if self.saver is not None:  # handle_preemptions did; cheap if so
            self.saver.before_writes(meta.fresh_blocks)
        stream = self.mover.current_stream()  # the engine's, for a load on the pool thread
        for rid, pairs in meta.loads:
            carrier = meta.traces.get(rid)
            started = now_ns()
            if self._pool is not None:
                ids = [b for _, b in pairs]
                fut = self._pool.submit(self.mover.load, pairs, stream)
                self._recving[rid] = (fut, ids)
                if carrier is not None:
                    fut.add_done_callback(self._traced_load(carrier, started, len(ids)))
            else:
                failed = self.mover.load(pairs)
                self._errors |= failed
                self.tracing.load(carrier, started, "sync", len(pairs), len(failed))

    def _traced_load(self, carrier: Carrier, started: int, blocks: int) -> Any:
        def done(fut: Future[set[int]]) -> None:  # on the load thread, as the copy ends
            failed = len(fut.result()) if fut.exception() is None else blocks
            self.tracing.load(carrier, started, "async", blocks, failed)

        return done

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return  # whole blocks of all layers are saved after the forward pass

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TierdConnectorMeta)
        started = now_ns()
        if self.saver is not None and self.mover is not None:
            fut = self.saver.submit(meta.saves, self.block_size, self.mover.current_stream())
            if fut is not None and meta.save_traces:
                traces, step = meta.save_traces, len(meta.saves)
                fut.add_done_callback(
                    lambda f: self.tracing.saves(
                        traces, started, "async", step, f.exception() is not None
                    )
                )
        elif self.mover is not None and meta.saves:
            self.mover.save(meta.saves, self.block_size)
            self.tracing.saves(meta.save_traces, started, "sync", len(meta.saves), False)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.mover is not None:
            self.mover.poll()  # commit saves whose device copies are done
        done: set[str] = set()
        for rid, (fut, ids) in list(self._recving.items()):
            if not fut.done():
                continue
            try:
                self._errors |= fut.result()
            except Exception as exc:  # a bug in the copy: fail safe, recompute
                log.warning("tierd load for %s failed: %r", rid, exc)
                self._errors |= set(ids)
            del self._recving[rid]
            done.add(rid)
        return None, done or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    def shutdown(self) -> None:
        if self._lookup_pool is not None:
            self._lookup_pool.shutdown(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.saver is not None:
            self.saver.close()
        if self.mover is not None:
            self.mover.close()
        self._write_stats()
        self.link.close()
        self.tracing.shutdown()
