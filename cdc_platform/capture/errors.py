"""Capture errors: retriable ones are retried with backoff; fatal ones stop at once
with a message that names the fix."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("cdc_platform.capture")


class CaptureError(RuntimeError):
    retriable = False


class RetriableCaptureError(CaptureError):
    """Network trouble, a restarting database or broker: reconnect and resume from the
    slot's confirmed position."""

    retriable = True


class FatalCaptureError(CaptureError):
    """Retrying cannot help until someone changes something; the message says what."""


class SlotLostError(FatalCaptureError):
    """The replication slot is gone or invalidated: changes were lost and the tables
    must be rehydrated (a new snapshot generation)."""

    reason = "source_position_lost"


class Backoff:
    """Waits between retries of retriable errors: 0.5 s, doubling up to ``max_wait_s``; after
    ``give_up_after_s`` of failing without a success in between (None: never) the error is
    raised instead. Shared by every capture's run loop."""

    def __init__(
        self, max_wait_s: float, give_up_after_s: float | None, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.max_wait_s, self.give_up_after_s, self.sleep = max_wait_s, give_up_after_s, sleep
        self.reset()

    def reset(self) -> None:
        """A success: the next failure starts from the shortest wait."""
        self.wait = 0.5
        self.failing_since: float | None = None

    def failed(self, error: CaptureError) -> None:
        now = time.monotonic()
        self.failing_since = self.failing_since or now
        if self.give_up_after_s is not None and now - self.failing_since > self.give_up_after_s:
            raise RetriableCaptureError(f"{error} (gave up after {self.give_up_after_s:.0f} s)") from None
        log.warning("%s; retrying in %.1f s", error, self.wait)
        self.sleep(self.wait)
        self.wait = min(self.wait * 2, self.max_wait_s)


def classify_postgres_error(exc: BaseException, *, source: str, user: str, slot: str | None = None) -> CaptureError:
    """Map a libpq/psycopg error to retriable or fatal, with the fix in the message.
    libpq messages name host, port and user, never the password."""
    text = " ".join(str(exc).split())
    lowered = text.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return FatalCaptureError(
            f"source '{source}': bad credentials for user {user} ({text}); fix sources.{source}.user or the "
            f"password in the environment variable named by sources.{source}.password_env"
        )
    if "must be superuser or replication role" in lowered or "permission denied to start wal sender" in lowered:
        return FatalCaptureError(
            f"source '{source}': role {user} may not stream changes; as an admin run: ALTER ROLE {user} REPLICATION"
        )
    if "database" in lowered and "does not exist" in lowered:
        return FatalCaptureError(f"source '{source}': {text}; fix sources.{source}.database")
    if slot is None:
        return RetriableCaptureError(f"source '{source}': cannot connect ({text}); is the database up and reachable?")
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
        return FatalCaptureError(
            f"source '{source}': replication slot {slot} is in use by another process ({text}); "
            "run only one capture per source"
        )
    return RetriableCaptureError(f"source '{source}': {text}")
