"""libpq/psycopg errors, classified: retriable or fatal, with the fix in the message.
libpq messages name host, port and user, never the password."""

from __future__ import annotations

from cdc_platform.model.errors import CdcError, FatalError, RetriableError, SlotLostError


def classify_postgres_error(exc: BaseException, *, source: str, user: str, slot: str | None = None) -> CdcError:
    text = " ".join(str(exc).split())
    lowered = text.lower()
    fatal = _fatal(lowered, text, source, user)
    if fatal is not None:
        return fatal
    if slot is None:
        return RetriableError(f"source '{source}': cannot connect ({text}); is the database up and reachable?")
    if (
        ("replication slot" in lowered and "does not exist" in lowered)
        or "can no longer get changes" in lowered
        or ("has been invalidated" in lowered)
    ):
        return SlotLostError(
            f"source '{source}': replication slot {slot} was dropped or invalidated ({text}); changes since its "
            f"last confirmed position are gone. The captured tables must be rehydrated (new snapshot "
            f"generation); restart capture to create a new slot."
        )
    if "is active for pid" in lowered:
        return FatalError(
            f"source '{source}': replication slot {slot} is in use by another process ({text}); "
            "run only one capture per source"
        )
    return RetriableError(f"source '{source}': {text}")


def _fatal(lowered: str, text: str, source: str, user: str) -> CdcError | None:
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return FatalError(
            f"source '{source}': bad credentials for user {user} ({text}); fix sources.{source}.user or the "
            f"password in the environment variable named by sources.{source}.password_env"
        )
    if "must be superuser or replication role" in lowered or "permission denied to start wal sender" in lowered:
        return FatalError(
            f"source '{source}': role {user} may not stream changes; as an admin run: ALTER ROLE {user} REPLICATION"
        )
    if "database" in lowered and "does not exist" in lowered:
        return FatalError(f"source '{source}': {text}; fix sources.{source}.database")
    if "permission denied for" in lowered:
        return FatalError(f"source '{source}': {text}; grant the privilege to role {user} (see README, 'Capture')")
    return None
