"""The one place where the platform's errors become Dagster failures.

Every layer raises errors that carry their class (``model.errors``): retriable ones let
the step's RetryPolicy retry with backoff, fatal ones fail once with the fix. Anything
else (a Spark or driver exception) is classified first (``lake/errors.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from cdc_platform.lake.errors import classify_spark_error
from cdc_platform.model.errors import CdcError

# retriable failures (network, broker or database briefly unavailable) retry with backoff;
# fatal ones raise dg.Failure(allow_retries=False) with the fix
RETRY_POLICY = dg.RetryPolicy(max_retries=3, delay=5, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)


def as_failure(error: CdcError) -> dg.Failure:
    metadata = {"error_class": dg.MetadataValue.text(error.kind)}
    if error.reason:
        metadata["reason"] = dg.MetadataValue.text(error.reason)
    return dg.Failure(description=str(error), metadata=metadata, allow_retries=error.retriable)


@contextmanager
def failures_mapped(context: str) -> Iterator[None]:
    """Run a step's body: its errors leave as ``dg.Failure`` carrying their class."""
    try:
        yield
    except dg.Failure:
        raise
    except CdcError as exc:
        raise as_failure(exc) from None
    except Exception as exc:  # classified, then raised as a Failure
        raise as_failure(classify_spark_error(exc, context)) from exc
