"""Logging set-up: plain ``logging`` with API keys redacted everywhere.

The redaction filter sits on the root handler, so uvicorn's access log of a
query string (``?api_key=...``) is scrubbed as well as our own records.

``quiet_client_mistakes`` turns uvicorn's traceback for a client's invalid
UTF-8 text frame (logged with ``logger.exception`` before it closes the
connection with 1007) into one INFO line: a client's mistake is not a
server error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

_QUERY_KEY = re.compile(r"(api_key=)[^&\s\"']+", re.IGNORECASE)
_BEARER = re.compile(r"(bearer\s+)\S+", re.IGNORECASE)
_SUBPROTOCOL = re.compile(r"(tts\.key\.)[^,\s\"']+")


class RedactingFilter(logging.Filter):
    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        text = _QUERY_KEY.sub(r"\1***", text)
        text = _BEARER.sub(r"\1***", text)
        return _SUBPROTOCOL.sub(r"\1***", text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self.redact(message)
        if redacted != message:
            record.msg = redacted
            record.args = None
        return True


def configure_logging(level: str, secrets: Iterable[str]) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


#: uvicorn's messages (logger ``uvicorn.error``) that report a client mistake
CLIENT_MISTAKES = ("Invalid UTF-8 sequence received from client.",)


class ClientMistakeFilter(logging.Filter):
    """Downgrades ``CLIENT_MISTAKES`` to INFO without a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in CLIENT_MISTAKES:
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.INFO
            record.levelname = logging.getLevelName(logging.INFO)
        return True


def quiet_client_mistakes() -> None:
    """Install ``ClientMistakeFilter`` on uvicorn's error logger (once)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ClientMistakeFilter) for f in logger.filters):
        logger.addFilter(ClientMistakeFilter())
