"""Error classes shared by every layer: each error says whether retrying can help.

* ``RetriableError`` — the network, a database or broker restarting, a window that is
  not closed yet: retry with backoff (capture's loops, Dagster's RetryPolicy).
* ``FatalError`` — retrying cannot help until someone changes something; the message
  names the fix (bad credentials, a missing table, an incompatible schema, a changelog
  gap that needs a new generation).

``reason`` names a condition the platform reacts to (``changelog_gap``,
``source_position_lost``, ``schema_incompatible``): the rehydration sensor, run tags and
the CLI's exit codes use it. The Dagster edge maps the class, never exception lists.
"""

from __future__ import annotations

from typing import ClassVar


class CdcError(RuntimeError):
    """Base of every error the platform raises on purpose. ``retriable`` is the class's
    verdict; an instance may carry a ``reason`` for the sensors and the CLI."""

    retriable: ClassVar[bool] = False
    default_reason: ClassVar[str | None] = None

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or self.default_reason

    @property
    def kind(self) -> str:
        return "retriable" if self.retriable else "fatal"


class RetriableError(CdcError):
    """Retrying after a pause can help: connection lost, service restarting, not ready yet."""

    retriable = True


class FatalError(CdcError):
    """Retrying cannot help until something is changed; the message says what."""


class MissingSecretError(FatalError):
    """A secret's environment variable is not set."""


class SourceTableError(FatalError):
    """The table is missing or cannot be captured as configured; the message names the fix."""


class SlotLostError(FatalError):
    """The source position (replication slot) is gone or invalidated: changes were lost
    and the tables must be rehydrated (a new snapshot generation)."""

    default_reason = "source_position_lost"


class ChangelogGapError(FatalError):
    """Offsets the changelog needs are gone from Kafka: rehydrate (a new generation)."""

    default_reason = "changelog_gap"


class WindowNotClosedError(RetriableError):
    """A changelog window is still open: it closes with time (the sensor asks only for closed ones)."""


class DeadLetterError(FatalError):
    """``errors.tolerance`` is ``none`` and records cannot be decoded."""


class SchemaIncompatibleError(FatalError):
    """The source schema changed incompatibly under the table's mode: nothing is applied."""

    default_reason = "schema_incompatible"


class GenerationRejectedError(FatalError):
    """A snapshot generation failed its validation (rows, keys): it is never used."""


class NoGenerationError(FatalError):
    """The table has no committed generation yet."""


def as_cdc_error(exc: BaseException, context: str) -> CdcError:
    """An unexpected exception in ``context``, classified: errors of ours keep their class;
    anything else is retriable (a transient fault is the likelier cause of a surprise, and
    retries are bounded), with the original text."""
    if isinstance(exc, CdcError):
        return exc
    text = " ".join(str(exc).split())[:2000]
    return RetriableError(f"{context}: {type(exc).__name__}: {text}")
