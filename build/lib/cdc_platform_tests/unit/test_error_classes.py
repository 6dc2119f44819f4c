"""Errors carry their class from every layer, and the Dagster edge maps the class:
retriable ones may be retried, fatal ones fail once with the fix (issue 13, bug 6)."""

from __future__ import annotations

import dagster as dg
import pytest

from cdc_platform.config.model import JdbcSource
from cdc_platform.lake.errors import classify_spark_error
from cdc_platform.model.errors import (
    ChangelogGapError,
    FatalError,
    GenerationRejectedError,
    RetriableError,
    SchemaIncompatibleError,
    SlotLostError,
    SourceTableError,
    WindowNotClosedError,
    as_cdc_error,
)
from cdc_platform.orchestration.failures import as_failure, failures_mapped
from cdc_platform.sources.mysql.connection import classify_mysql_error


@pytest.mark.parametrize(
    ("error", "retriable", "reason"),
    [
        (WindowNotClosedError("open"), True, None),
        (ChangelogGapError("gap"), False, "changelog_gap"),
        (SlotLostError("slot"), False, "source_position_lost"),
        (SchemaIncompatibleError("schema"), False, "schema_incompatible"),
        (SourceTableError("missing"), False, None),
        (GenerationRejectedError("not unique"), False, None),
    ],
)
def test_each_error_says_whether_retrying_helps(
    error: FatalError | RetriableError, retriable: bool, reason: str | None
) -> None:
    assert (error.retriable, error.reason) == (retriable, reason)
    failure = as_failure(error)
    assert failure.allow_retries is retriable
    assert failure.metadata["error_class"].value == ("retriable" if retriable else "fatal")


SPARK_TRACE = (
    "An error occurred while calling o123.save.\n: org.apache.spark.SparkException: Job aborted due to stage failure: "
    "Task 0 in stage 3.0 failed 1 times, most recent failure: {cause}\n\tat org.apache.spark.scheduler.DAGScheduler"
)


@pytest.mark.parametrize(
    ("cause", "retriable", "says"),
    [
        ("java.sql.SQLNonTransientConnectionException: Socket fail to connect to host:127.0.0.1, port:3308. "
         "Connection refused", True, "unreachable"),
        ("org.postgresql.util.PSQLException: Connection to 127.0.0.1:5434 refused.", True, "unreachable"),
        ('org.postgresql.util.PSQLException: FATAL: password authentication failed for user "cdc_capture"', False,
         "bad credentials"),
        ('org.postgresql.util.PSQLException: ERROR: relation "public.gone" does not exist', False, "table is missing"),
        ("java.lang.IllegalStateException: something new", True, "IllegalStateException"),
    ],
)  # fmt: skip
def test_spark_errors_are_classified_from_the_java_cause(cause: str, retriable: bool, says: str) -> None:
    error = classify_spark_error(RuntimeError(SPARK_TRACE.format(cause=cause)), "snapshot of s.t")
    assert error.retriable is retriable and says in str(error) and str(error).startswith("snapshot of s.t")
    assert "DAGScheduler" not in str(error)  # the first cause, not the stack


def test_a_mariadb_outage_is_retriable_and_bad_credentials_are_fatal() -> None:
    source = JdbcSource(kind="jdbc", database="crm", user="cdc_poll", password_env="P")
    refused = classify_mysql_error(OSError(2003, "Can't connect to MySQL server (Connection refused)"), "crm", source)
    assert refused.retriable
    denied = classify_mysql_error(OSError(1045, "Access denied for user 'cdc_poll'"), "crm", source)
    assert not denied.retriable and "password_env" in str(denied)


def test_the_edge_maps_the_class_not_exception_lists() -> None:
    with pytest.raises(dg.Failure) as fatal, failures_mapped("x"):
        raise SourceTableError("table gone; fix the name")
    assert fatal.value.allow_retries is False and "fix the name" in str(fatal.value.description)
    with pytest.raises(dg.Failure) as transient, failures_mapped("changelog of s.t"):
        raise ConnectionResetError("connection reset by peer")
    assert transient.value.allow_retries is True
    assert as_cdc_error(KeyError("k"), "ctx").retriable
