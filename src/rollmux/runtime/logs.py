"""Structured logs of the control plane: one JSON object per line (stdlib logging).

Every record carries ``ts`` (ISO 8601, UTC), ``level``, ``event`` (what happened:
``start``, ``decision``, ``grant``, ``finish``, ``depart``, ``expire``, ``reconcile``,
``node``, ``refused``, ``commit_failed``, ``error``) and the fields passed as ``extra``
(job_id, group_id, pool, nodes, field, reason, ...).
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from pathlib import Path

LOGGER = "rollmux.service"
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "event": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STANDARD:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(log_file: str | Path | None = None, level: str = "info") -> logging.Logger:
    """The service logger, writing JSON lines to ``log_file`` or stderr."""
    logger = logging.getLogger(LOGGER)
    logger.handlers.clear()
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger
