"""Structured logs: one JSON object per line (default) or plain text, on stderr.

Every line has ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``msg``; fields passed with
``extra={"fields": {...}}`` are added at the top level (``cycle``, ``status``, ``solve_s``...), so a
log shipper (journald -> Loki, Vector, Fluent Bit) can index them without parsing the message.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any, TextIO

__all__ = ["JsonFormatter", "setup_logging"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for k, v in fields.items():
                doc.setdefault(str(k), v)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


def setup_logging(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Configure the root logger for the service (replaces its handlers)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # aiomqtt/paho are chatty at debug level; keep them at warning unless asked
    if level != "debug":
        logging.getLogger("racktwin.bus.mqtt").setLevel(logging.WARNING)
