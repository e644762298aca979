"""`warmgate serve`: serve the gateway for the instances in the configuration
(`--config FILE` or `WARMGATE_CONFIG`, `WARMGATE_*` env). Every flag has an env twin:
`--host` WARMGATE_HOST, `--port` WARMGATE_PORT, `--log-level` WARMGATE_LOG_LEVEL,
`--policy` WARMGATE_ROUTING__POLICY."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError

from gateway.app import create_app
from gateway.config.settings import Settings, load_settings
from gateway.http.access import Access, is_loopback
from gateway.http.listener import serve
from gateway.observe.gc_pauses import tune_collector
from gateway.observe.logs import configure_logging, logging_config

log = logging.getLogger("warmgate.serve")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warmgate serve", description=__doc__)
    p.add_argument("--config", help="YAML settings file (env: WARMGATE_CONFIG)")
    p.add_argument("--host", help="listen address (env: WARMGATE_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (env: WARMGATE_PORT, default 8000)")
    p.add_argument("--log-level", help="debug, info, warning (env: WARMGATE_LOG_LEVEL)")
    p.add_argument("--policy", help="routing policy (env: WARMGATE_ROUTING__POLICY)")
    return p.parse_args(list(argv))


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for name in ("host", "port", "log_level"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    settings = load_settings(args.config, **overrides)
    if args.policy:  # validated as the YAML's routing.policy is: name and typed params
        routing = type(settings.routing).model_validate(
            {**settings.routing.model_dump(), "policy": args.policy}
        )
        settings = settings.model_copy(update={"routing": routing})
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = settings_from_args(args)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"warmgate serve: bad configuration: {exc}", file=sys.stderr)
        return 2
    if not settings.instances:
        print(
            "warmgate serve: no instances configured (see README, Configuration)", file=sys.stderr
        )
        return 2
    configure_logging(settings.log_level)
    for warning in exposure_warnings(settings):
        log.warning(warning)
    tune_collector(settings.gc)
    app = create_app(settings)
    # What start-up made (modules, routes, settings) lives as long as the process: frozen,
    # no full collection walks it again, so each pauses the requests in flight for less.
    gc.freeze()
    if settings.gc.freeze_after_start:
        freeze_when_started(app)
    serve(app, settings, logging_config(settings.log_level))
    return 0


def freeze_when_started(app: FastAPI) -> None:
    """Freeze again once the app's lifespan has started (the router, the clients, the
    tasks it built live as long as the process too), before the first request."""
    started = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[Any]:
        async with started(a) as value:
            gc.freeze()
            yield value

    app.router.lifespan_context = lifespan


def exposure_warnings(settings: Settings) -> list[str]:
    """What a public bind leaves open (said at start, never silently)."""
    if is_loopback(settings.host):
        return []
    out: list[str] = []
    access = Access(settings)
    where = f"{settings.host}:{settings.port}"
    if not access.clients and not access.admins:
        out.append(f"no API keys: the OpenAI API on {where} is open to anyone who reaches it")
    if not access.admins:
        admin = settings.auth
        out.append(
            f"no admin keys: the admin API is not served on {where}"
            + (
                f"; it is on {admin.admin_host}:{admin.admin_port}"
                if admin.admin_port is not None
                else " (set auth.admin_keys or auth.admin_port)"
            )
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
