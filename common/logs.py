"""JSON logs, one object a line, with secret redaction as a last line of defence.

Handlers never log secret material on purpose. The redactor also scrubs any registered secret
string from every record, so a future mistake (an exception message quoting a value, say) still
cannot put ``slurm.key`` into a log line.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

# Record attributes that are not ``extra`` fields. uvicorn's ``color_message`` repeats the
# message with ANSI escape codes for terminals; JSON lines do not want it.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}
REDACTED = "[REDACTED]"


class SecretRedactor:
    """Holds the secret strings known to this process and removes them from text."""

    def __init__(self) -> None:
        self._secrets: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def register(self, *values: str) -> None:
        # Short strings would redact ordinary words; real keys are long.
        fresh = {v for v in values if isinstance(v, str) and len(v) >= 8}
        if fresh - self._secrets:
            with self._lock:
                self._secrets = self._secrets | fresh

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


redactor = SecretRedactor()


class JsonFormatter(logging.Formatter):
    """Renders a record and its ``extra`` fields as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key == "fields" and isinstance(value, dict):
                entry.update(value)  # lets callers use names LogRecord reserves, such as "name"
            elif key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return redactor.scrub(json.dumps(entry, default=str, separators=(",", ":")))


def configure_logging(level: str = "INFO", stream: Any = None) -> None:
    """Route every logger (ours, uvicorn's, kubernetes') through the JSON formatter."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # One access line per admission would double our own decision log, and uvicorn's start-up
    # lines come once per server (two per process): the runner logs one "serving" line instead.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    # httpx logs every request at INFO: with node demand polled each second that is two lines a
    # second of "GET .../jobs/ 200" (the real whole loop showed it). Failures reach our own logs
    # through the slurmrestd client's errors; at DEBUG the requests show again.
    logging.getLogger("httpx").setLevel(logging.WARNING if root.getEffectiveLevel() > logging.DEBUG else logging.NOTSET)
