"""Errors raised inside Spark (Java exceptions through py4j), classified like every other.

A JDBC read or a Delta write fails in the JVM; its Java exception chain says whether
retrying can help: a refused or reset connection, a timeout, a restarting server are
retriable; bad credentials, a missing table or column, a permission are fatal and name
the fix. Anything unrecognised is retriable (bounded retries beat a silent stop).
"""

from __future__ import annotations

import re

from cdc_platform.model.errors import CdcError, FatalError, RetriableError

_FATAL = (
    # Java's Kafka client (Spark's Kafka source): before the databases' patterns, which
    # "authentication failed" would match with a database's fix
    (re.compile(r"saslauthenticationexception|sasl authentication", re.I),
     "Kafka refused the client's credentials; fix sasl.username in kafka.options or the password in the "
     "environment variable kafka.secret_options_env names (Spark's executors read it too)"),
    (re.compile(r"(topic|group)authorizationexception|not authorized to access", re.I),
     "Kafka's ACLs refuse the platform's client; allow it to read the table's topic and to use the groups "
     "named cdc_platform.* (README, \"Secured Kafka\")"),
    (re.compile(r"sslhandshakeexception|ssl handshake failed", re.I),
     "the TLS handshake with Kafka failed; check kafka.options ssl.ca.location (the CA that signed the brokers' "
     "certificates) and ssl.endpoint.identification.algorithm"),
    (re.compile(r"password authentication failed|access denied for user|authentication failed", re.I),
     "bad credentials; fix the source's user or the password in the environment variable named by password_env"),
    (re.compile(r"relation .* does not exist|table .* doesn't exist|unknown table", re.I),
     "the table is missing in the source; fix the name in the config or create it"),
    (re.compile(r"permission denied|command denied|access denied", re.I),
     "the platform's role lacks a privilege; grant SELECT on the table (see README, roles)"),
    (re.compile(r"bigint out of range", re.I),
     "a timestamp holds an instant after 294247-01-10, beyond the lake's 64-bit microseconds "
     "(PostgreSQL allows up to 294276); correct the value, then take a generation again "
     "(the changelog dead-letters such changes meanwhile)"),
    (re.compile(r"bad value for type bigdecimal ?: ?nan", re.I),
     "a numeric(p,s) column holds NaN, which the lake's decimal(p,s) cannot hold (numeric without (p,s) keeps "
     "it as text); correct the value or declare the column numeric, then take a generation again "
     "(the changelog dead-letters such changes meanwhile)"),
    (re.compile(r"column .* does not exist|unknown column", re.I),
     "a column changed in the source; take a new generation (cdc-platform rehydrate)"),
)  # fmt: skip
_RETRIABLE = re.compile(
    r"connectexception|connection refused|connection to \S+ refused|connection reset|socketexception|"
    r"sockettimeout|timeout|the connection attempt failed|could not connect|server closed the connection|"
    r"sqlstate[:= ]+08|non-transient connection|communications link failure|broken pipe|eofexception",
    re.I,
)


# raised in a Spark task by a read that meets a value its lake type cannot hold
# (lake/snapshot.py): the message names the column and the fix
VALUE_REFUSED = "lake value refused"
_VALUE_REFUSED = re.compile(VALUE_REFUSED + r": (.*?)(?: SQLSTATE|$)")


def classify_spark_error(exc: BaseException, context: str) -> CdcError:
    """``exc`` from a Spark action in ``context`` (e.g. 'snapshot of shop.public.orders')."""
    if isinstance(exc, CdcError):
        return exc
    text = " ".join(str(exc).split())
    refused = _VALUE_REFUSED.search(text)
    if refused:
        return FatalError(f"{context}: {refused.group(1)}")
    for pattern, fix in _FATAL:
        if pattern.search(text):
            return FatalError(f"{context}: {fix} ({_first_cause(text)})")
    if _RETRIABLE.search(text):
        return RetriableError(f"{context}: a service was unreachable, retrying can help ({_first_cause(text)})")
    return RetriableError(f"{context}: {type(exc).__name__}: {_first_cause(text)}")


def _first_cause(text: str, limit: int = 600) -> str:
    """The Java exception's first line (the rest is a stack trace)."""
    for marker in (" at org.", " at java.", " at scala.", "\tat "):
        cut = text.find(marker)
        if cut > 0:
            text = text[:cut]
    return text[:limit]
