"""SGLang-style info routes, so gateways built for SGLang workers (the SGLang model gateway
`smg`) can register and poll the simulated engine as they would a real worker:
`/get_server_info` (`/server_info`), `/get_model_info` (`/model_info`) and `/get_load`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request

from sim.engine.core import Engine

VERSION = "warmgate-sim"


def add_sglang_routes(app: FastAPI, engine_of: Callable[[Request], Engine]) -> None:
    def server_info(engine: Engine) -> dict[str, Any]:
        c, s = engine.config, engine.scheduler
        return {
            "model_path": c.model,
            "served_model_name": c.model,
            "tokenizer_path": c.model,
            "tp_size": 1,
            "dp_size": 1,
            "page_size": c.block_tokens,
            "context_length": engine.max_model_len,
            "chunked_prefill_size": s.max_batch_tokens,
            "max_running_requests": s.max_num_seqs,
            "max_total_num_tokens": engine.cache.num_blocks * engine.cache.block_tokens,
            "version": VERSION,
        }

    def model_info(engine: Engine) -> dict[str, Any]:
        c = engine.config
        return {
            "model_path": c.model,
            "tokenizer_path": c.model,
            "served_model_name": c.model,
            "is_generation": True,
            "model_type": "transformer",
            "max_context_length": engine.max_model_len,
            "weight_version": "default",
        }

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info(request: Request) -> dict[str, Any]:
        return server_info(engine_of(request))

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def get_model_info(request: Request) -> dict[str, Any]:
        return model_info(engine_of(request))

    @app.get("/get_load")
    async def get_load(request: Request) -> list[dict[str, Any]]:
        engine = engine_of(request)
        running, waiting, _ = engine.gauges()
        used = engine.cache.used_blocks * engine.cache.block_tokens
        return [
            {
                "dp_rank": 0,
                "num_reqs": running + waiting,
                "num_waiting_reqs": waiting,
                "num_tokens": used,
            }
        ]
