"""Credentials never printed, logged or raised: URL user parts, query strings and header values.

An OTLP endpoint can carry a password (`https://user:TOKEN@host`) or a token in its query
(`?token=...`), and `OTEL_EXPORTER_OTLP_HEADERS` holds `Authorization=Bearer ...`. Every
message hp_otel writes that could contain them goes through `redact_url` / `mask_secrets`,
and while telemetry is configured `SecretsFilter` does the same to the log records of the
SDK's and exporters' own loggers (a gRPC retry line names its target, urllib3 its URL),
including the text of an exception they log.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable

MASK = "***"
# scheme://[userinfo@]host[:port][/path][?query][#fragment], up to a space or a quote
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]*")
# a path's query without scheme or host (urllib3: "POST /v1/traces?token=... HTTP/1.1")
_PATH_QUERY = re.compile(r"(?<![\w:/])(/[^\s?'\"<>]*)\?[^\s'\"<>]+")
# user:password@ without a scheme (a gRPC target), or after one
_USERINFO = re.compile(r"(?<![\w.\-~%!$&'()*+,;=:@])[\w.\-~%!$&'()*+,;=]+:[^\s'\"<>@/]*@")


def redact_url(url: str | None) -> str | None:
    """The URL with its user part, query and fragment replaced by `***` (`https://***@host/v1/traces?***`)."""
    if not url:
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    before, after = rest[:end], rest[end:]
    if "@" in before:  # everything up to the last '@' is the user part (a password may hold '/')
        before = MASK + before[before.rindex("@") :]
    if after:
        after = after[0] + MASK
    return f"{scheme}{sep}{before}{after}"


def mask_secrets(text: str, known: Iterable[str] = ()) -> str:
    """`text` with every URL redacted, every `user:password@` masked and every `known` secret replaced."""
    text = _URL.sub(lambda match: redact_url(match.group()) or "", text)
    text = _USERINFO.sub(MASK + "@", text)
    text = _PATH_QUERY.sub(lambda match: match.group(1) + "?" + MASK, text)
    for secret in sorted({k for k in known if k and len(k) >= 3}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


class SecretsFilter(logging.Filter):
    """Masks credentials in a record's message and in the text of its exception (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._known: frozenset[str] = frozenset()

    def add_known(self, secrets: Iterable[str]) -> None:
        """Also replace these exact strings (header values, tokens) wherever they appear."""
        with self._lock:
            self._known = self._known | {s for s in secrets if isinstance(s, str) and s}

    @property
    def known(self) -> frozenset[str]:
        return self._known

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted: leave it to logging's own error path
            return True
        masked = mask_secrets(message, self._known)
        if masked != message or record.args:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_secrets(logging.Formatter().formatException(record.exc_info), self._known)
        elif record.exc_text:
            record.exc_text = mask_secrets(record.exc_text, self._known)
        return True


# Loggers whose records may name an endpoint or a header: the SDK's and exporters' (log_limits lists
# them) and urllib3's connection pool (the HTTP exporter's requests log the URL at DEBUG).
_filter = SecretsFilter()
_installed: set[str] = set()


def mask_sdk_logs(logger_names: Iterable[str], known: Iterable[str] = ()) -> SecretsFilter:
    """Install the filter on these loggers (once each) and learn `known` secrets; it stays installed."""
    _filter.add_known(known)
    for name in (*logger_names, "urllib3.connectionpool"):
        if name not in _installed:
            _installed.add(name)
            logging.getLogger(name).addFilter(_filter)
    return _filter
