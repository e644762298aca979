"""`python -m sim.engine ...`: run one simulated engine with uvicorn."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import uvicorn

from sim.engine.app import create_app
from sim.engine.config import parse_config


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
