"""`python -m sim.engine ...`: run one simulated engine with uvicorn, logging JSON lines
(uvicorn's loggers included) to stderr."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence

import uvicorn

from sim.engine.app import create_app
from sim.engine.config import parse_config


class JsonLines(logging.Formatter):
    """One JSON object a record: time, level, logger, message, the engine's instance id."""

    def __init__(self, instance_id: str):
        super().__init__()
        self.instance_id = instance_id

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "instance": self.instance_id,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines(config.instance_id))
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
