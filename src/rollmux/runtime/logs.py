"""Structured logs of the control plane: one JSON object per line (stdlib logging).

Every record carries ``ts`` (ISO 8601, UTC), ``level``, ``event`` (what happened:
``start``, ``decision``, ``grant``, ``finish``, ``depart``, ``expire``, ``reconcile``,
``node``, ``refused``, ``commit_failed``, ``error``, ``admin_token``,
``unlisted_tenants``) and the fields
passed as ``extra`` (job_id, group_id, pool, nodes, field, reason, ...). What the HTTP
server (uvicorn) itself says, such as a request it could not parse, comes as event
``server`` with its ``logger`` and ``message``: the stream stays one JSON object per line.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from pathlib import Path

LOGGER = "rollmux.service"
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "event": record.getMessage()}
        if not record.name.startswith(LOGGER):
            out.update(event="server", logger=record.name, message=record.getMessage())
        for key, value in vars(record).items():
            if key not in _STANDARD:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(log_file: str | Path | None = None, level: str = "info") -> logging.Logger:
    """The service logger, writing JSON lines to ``log_file`` or stderr; uvicorn's loggers
    write there too, in the same shape (warnings and above)."""
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name, floor in ((LOGGER, level.upper()), *((n, "WARNING") for n in SERVER_LOGGERS)):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.addHandler(handler)
        logger.setLevel(floor)
        logger.propagate = False
    return logging.getLogger(LOGGER)
