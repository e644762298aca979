"""`tierd serve`: parse flags (each with a `WARMGATE_TIERD__<NAME>` env twin, and an
optional YAML file via `--config`), build the settings and run the API under uvicorn until
SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn
from pydantic import ValidationError

from contracts.errors import ConfigurationError
from contracts.json_logs import JsonFormatter
from tierd.api import create_app
from tierd.emulation import PROFILES
from tierd.settings import TierdSettings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tierd serve", description="run the tier daemon")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--instance-id")
    p.add_argument("--l1-bytes", type=int, help="L1 arena size in bytes")
    p.add_argument("--slice-bytes", type=int, help="L1 slot size (largest slice) in bytes")
    p.add_argument("--l1-backend", choices=["auto", "host", "cuda", "hip"], help="L1 arena memory")
    p.add_argument("--array-dir", type=Path, help="array directory (may be shared)")
    p.add_argument("--array-bytes", type=int, help="array capacity of our own (0: none)")
    p.add_argument("--snapshot-dir", type=Path)
    p.add_argument("--snapshot-bytes", type=int, help="snapshot capacity (0: none)")
    p.add_argument("--session-ttl-s", type=float, help="idle dialogue: protection ends")
    p.add_argument("--fsync", action="store_true", default=None, help="fsync array writes")
    p.add_argument("--emulate", choices=sorted(PROFILES), help="charge real-model load times")
    p.add_argument("--array-gbps", type=float, help="emulated array→L1 GB/s (overrides)")
    p.add_argument("--snapshot-gbps", type=float, help="emulated snapshot→L1 GB/s")
    p.add_argument(
        "--time-scale", type=float, help="wall seconds per emulated second (match the engines)"
    )
    p.add_argument(
        "--array-o-direct",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="O_DIRECT array reads where allowed (default on)",
    )
    p.add_argument("--kv-socket", type=Path, help="Unix socket for an engine's KV connector")
    p.add_argument("--kv-namespace", help="refuse connectors of another model/dtype/hashing")
    p.add_argument("--engine-events", help="the engine's KV events (ZMQ), for BlockRemoved")
    p.add_argument("--events-endpoint", help="ZMQ PUB bind address, e.g. tcp://127.0.0.1:5557")
    p.add_argument("--events-topic")
    p.add_argument("--redis-url", help="also XADD events to warmgate:{pool}:events")
    p.add_argument("--pool")
    p.add_argument("--protect-fraction", type=float)
    p.add_argument("--temp-grace-s", type=float)
    p.add_argument("--config", type=Path, help="YAML file of settings (flags and env win over it)")
    p.add_argument("--log-level", default="warning")
    return p


def settings_from_args(args: argparse.Namespace) -> TierdSettings:
    """Flags, over `WARMGATE_TIERD__*` env, over the YAML file's values, over defaults (the
    gateway's precedence; `tierd.settings`)."""
    given: dict[str, Any] = {
        k: v for k, v in vars(args).items() if v is not None and k not in ("log_level", "config")
    }
    if args.config is not None:
        given["config_file"] = args.config
    return TierdSettings(**given)


def configure_logging(level: str) -> None:
    """Every logger, uvicorn's included, through one JSON-lines handler on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())  # contracts.json_logs: every process's format
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
    except (ValidationError, ConfigurationError) as exc:  # as `warmgate serve` reports it
        print(f"tierd serve: bad configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        log_config=None,
        access_log=False,
    )
    uvicorn.Server(config).run()
    return 0
