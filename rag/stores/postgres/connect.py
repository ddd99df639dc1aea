"""Connections to the document store's database: bounded timeouts on every call, and errors that
name the problem without the password.

Example:
    >>> conn = connect("postgresql://rag:secret@127.0.0.1:5432/rag")   # doctest: +SKIP
    >>> describe(exc)                                                   # doctest: +SKIP
    'password authentication failed for user "rag"'
"""

from __future__ import annotations

import psycopg

from rag.config import redact_url

CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 120_000  # a whole collection's rows, streamed, stay far below this
# libpq keepalives: a peer that vanished without closing (a cut network) is noticed within seconds
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection:
    """A new connection (OperationalError when the server refuses or does not answer in time)."""
    return psycopg.connect(
        url,
        autocommit=autocommit,
        connect_timeout=CONNECT_TIMEOUT_S,
        options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c idle_in_transaction_session_timeout=300000",
        application_name="prefixrag",
        tcp_user_timeout=15_000,
        **_KEEPALIVES,  # type: ignore[arg-type]
    )


def describe(exc: BaseException) -> str:
    """The server's or libpq's reason for a failure, on one line (``FATAL:`` and hints dropped)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = next(
        (line for line in lines if "FATAL:" in line or "failed:" in line), lines[0] if lines else ""
    )
    for marker in ("FATAL:", "failed:"):
        if marker in reason:
            reason = reason.rsplit(marker, 1)[1].strip()
    return reason or type(exc).__name__


def where(url: str) -> str:
    """The URL as messages show it (no password)."""
    return redact_url(url)
