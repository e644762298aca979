"""`python -m sim.engine ...`: run one simulated engine with uvicorn, logging JSON lines
(uvicorn's loggers included) to stderr."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import uvicorn

from contracts.json_logs import JsonFormatter
from sim.engine.app import create_app
from sim.engine.config import parse_config


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    handler = logging.StreamHandler(sys.stderr)
    # contracts.json_logs: the format of every process of ours, with the engine's id
    handler.setFormatter(JsonFormatter(static={"instance": config.instance_id}))
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler], force=True)
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        log_config=None,  # uvicorn's loggers propagate to the JSON handler above
        log_level=config.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
