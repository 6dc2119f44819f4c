"""Pure parts of the polling source: MariaDB type mapping (one row per type), value
conversion, soft-delete rule, poll config validation, the reconciliation decision."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from pydantic import ValidationError

from cdc_platform.config.model import CompatibilityMode, PlatformConfig, PollConfig
from cdc_platform.envelope.pgtypes import ConversionOptions, builtin_type, to_json_value
from cdc_platform.lake.checks import CAPTURE_WAIT_S, capture_wait_s
from cdc_platform.lake.lake_types import lake_type
from cdc_platform.model.generations import Generation, GenerationStatus
from cdc_platform.model.rehydration import RECONCILIATION_GRACE_S, Reason, reconciliation_due, unseen_deletes
from cdc_platform.model.schemas import ColumnVersion, SchemaVersion, compare
from cdc_platform.sources import open_source
from cdc_platform.sources.base import Source
from cdc_platform.sources.mysql.catalog import (
    MappedColumn,
    json_valid_columns,
    live_row_sql,
    map_column,
    pg_text,
    schema_type_name,
    soft_deleted,
)
from cdc_platform.sources.mysql.cursors import TableCursor
from cdc_platform.sources.mysql.poller import CAUGHT_UP_EVERY_NS

# information_schema's DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE -> lake type
MAPPING_CASES = [
    ("tinyint", "tinyint(1)", 3, 0, "boolean"),
    ("tinyint", "tinyint(4)", 3, 0, "smallint"),
    ("tinyint", "tinyint(3) unsigned", 3, 0, "smallint"),
    ("smallint", "smallint(6)", 5, 0, "smallint"),
    ("smallint", "smallint(5) unsigned", 5, 0, "int"),
    ("mediumint", "mediumint(8) unsigned", 7, 0, "int"),
    ("int", "int(11)", 10, 0, "int"),
    ("int", "int(10) unsigned", 10, 0, "bigint"),
    ("bigint", "bigint(20)", 19, 0, "bigint"),
    ("bigint", "bigint(20) unsigned", 20, 0, "decimal(20,0)"),
    ("bit", "bit(1)", 1, None, "bigint"),
    ("bit", "bit(64)", 64, None, "decimal(20,0)"),
    ("decimal", "decimal(12,2)", 12, 2, "decimal(12,2)"),
    ("decimal", "decimal(65,30)", 65, 30, "string"),
    ("float", "float", 12, None, "float"),
    ("double", "double", 22, None, "double"),
    ("date", "date", None, None, "date"),
    ("datetime", "datetime(6)", None, None, "timestamp_ntz"),
    ("timestamp", "timestamp(3)", None, None, "timestamp"),
    ("time", "time", None, None, "string"),
    ("year", "year(4)", None, None, "smallint"),
    ("json", "json", None, None, "string"),
    ("longtext", "longtext", None, None, "string"),
    ("varbinary", "varbinary(16)", None, None, "binary"),
    ("blob", "blob", None, None, "binary"),
    ("char", "char(3)", None, None, "string"),
    ("enum", "enum('a','b')", None, None, "string"),
    ("uuid", "uuid", None, None, "string"),
    ("geometry", "geometry", None, None, "string"),
]


@pytest.mark.parametrize(("data_type", "column_type", "precision", "scale", "lake"), MAPPING_CASES)
def test_each_mariadb_type_maps_to_its_lake_type(
    data_type: str, column_type: str, precision: int | None, scale: int | None, lake: str
) -> None:
    mapped = map_column("c", data_type, column_type, precision, scale)
    pgtype = builtin_type(mapped.pg_oid)
    assert pgtype is not None
    assert lake_type(pgtype, mapped.typmod).simpleString() == lake


def test_mariadb_json_is_a_checked_longtext() -> None:
    assert json_valid_columns(["json_valid(`doc`)", "`qty` > 0", "JSON_VALID(`we``ird`)"]) == {"doc", "we`ird"}
    mapped = map_column("doc", "longtext", "longtext", None, None, is_json=True)
    assert mapped.pg_oid == 114 and mapped.select_sql == "CAST(`doc` AS CHAR)"


def _envelope(
    value: object, data_type: str, column_type: str, precision: int | None = None, scale: int | None = None
) -> object:
    mapped = map_column("c", data_type, column_type, precision, scale)
    pgtype = builtin_type(mapped.pg_oid)
    assert pgtype is not None
    return to_json_value(pg_text(value, mapped.decode), pgtype, mapped.typmod, ConversionOptions("string"))


def test_values_read_by_the_poller_become_envelope_values() -> None:
    assert _envelope(1, "tinyint", "tinyint(1)") is True
    assert _envelope("18446744073709551615", "bigint", "bigint(20) unsigned", 20, 0) == "18446744073709551615"
    assert _envelope(Decimal("-12.50"), "decimal", "decimal(12,2)", 12, 2) == "-12.50"
    assert _envelope("DEADBEEF", "blob", "blob") == "3q2+7w=="  # base64, as Debezium writes bytes
    assert _envelope("2024-02-29 23:59:59.123456", "timestamp", "timestamp(6)") == "2024-02-29T23:59:59.123456Z"
    assert _envelope("2024-02-29 23:59:59.000000", "datetime", "datetime(6)") == 1709251199000000
    assert _envelope(None, "int", "int(11)") is None


def test_soft_delete_marker_rule_matches_its_sql() -> None:
    flag = MappedColumn("is_deleted", "tinyint(1)", 16, -1, "(`is_deleted` <> 0)", "bool")
    stamp = MappedColumn("deleted_at", "datetime(6)", 1114, -1, "DATE_FORMAT(...)", "timestamp")
    assert [soft_deleted(v, flag) for v in (None, 0, 1)] == [False, False, True]
    assert [soft_deleted(v, stamp) for v in (None, "2026-01-01 00:00:00.000000")] == [False, True]
    assert live_row_sql(flag) == "(`is_deleted` IS NULL OR `is_deleted` = 0)"
    assert live_row_sql(stamp) == "`deleted_at` IS NULL"


def test_poll_modes_need_their_columns() -> None:
    with pytest.raises(ValidationError, match="needs incrementing_column"):
        PollConfig(mode="timestamp+incrementing", timestamp_column="updated_at")
    with pytest.raises(ValidationError, match="needs timestamp_column"):
        PollConfig(mode="timestamp")
    with pytest.raises(ValidationError, match="not used in mode 'incrementing'"):
        PollConfig(mode="incrementing", incrementing_column="id", timestamp_column="updated_at")
    assert PollConfig(mode="timestamp", timestamp_column="t", reconcile_every="6h").reconcile_every_s() == 21600


def _config(table: dict[str, object], source_kind: str = "jdbc") -> dict[str, object]:
    source: dict[str, object] = {"database": "crm", "user": "u", "password_env": "P"}
    if source_kind == "jdbc":
        source["kind"] = "jdbc"
    return {
        "sources": {"crm": source},
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "lake": {"root": "lake"},
        "tables": [table],
    }


def test_jdbc_tables_need_a_poll_block_and_postgres_tables_refuse_one() -> None:
    poll = {"mode": "incrementing", "incrementing_column": "id"}
    config = PlatformConfig.model_validate(_config({"name": "crm.crm.accounts", "poll": poll}))
    assert config.tables[0].poll is not None
    with pytest.raises(ValidationError, match=r"needs a poll block, e\.g\. poll:"):
        PlatformConfig.model_validate(_config({"name": "crm.crm.accounts"}))
    with pytest.raises(ValidationError, match="captured by logical decoding; remove the poll block"):
        PlatformConfig.model_validate(_config({"name": "crm.public.accounts", "poll": poll}, "postgres"))
    with pytest.raises(ValidationError, match="plain-text password is not allowed"):
        data = _config({"name": "crm.crm.accounts", "poll": poll})
        data["sources"]["crm"]["password"] = "x"  # type: ignore[index]
        PlatformConfig.model_validate(data)


def test_reconciliation_is_due_once_per_generation_after_its_interval() -> None:
    committed_at = datetime(2026, 1, 1, tzinfo=UTC)
    g1 = Generation("crm.crm.a", "g1", GenerationStatus.COMMITTED, committed_at, committed_at)
    assert reconciliation_due("crm.crm.a", g1, 3600.0, committed_at + timedelta(seconds=3599)) is None
    due = reconciliation_due("crm.crm.a", g1, 3600.0, committed_at + timedelta(seconds=3601))
    assert due is not None and due.reason is Reason.RECONCILIATION and due.cause == "reconcile:g1"
    assert reconciliation_due("crm.crm.a", g1, None, committed_at + timedelta(days=999)) is None  # not configured


def test_rows_only_current_holds_pass_verify_only_while_a_reconciliation_will_drop_them() -> None:
    """verify on a polled table: rows the source hard-deleted are what the next
    reconciliation drops; without one configured, or with it overdue, they are a
    difference, and the explanation names the fix."""
    committed_at = datetime(2026, 1, 1, tzinfo=UTC)
    g1 = Generation("crm.crm.a", "g1", GenerationStatus.COMMITTED, committed_at, committed_at)
    pending, why = unseen_deletes(g1, 3600.0, committed_at + timedelta(minutes=30), 81)
    assert pending and why.startswith("81 row(s) in current are no longer in the source") and "01:00 UTC" in why
    late = committed_at + timedelta(seconds=3600 + RECONCILIATION_GRACE_S + 1)
    pending, why = unseen_deletes(g1, 3600.0, late, 81)
    assert not pending and "has not been taken: is the daemon's rehydration sensor running?" in why
    pending, why = unseen_deletes(g1, None, committed_at, 1)
    assert not pending and "set it (e.g. 6h), or run cdc-platform rehydrate" in why


def test_mariadb_schema_changes_are_judged_by_their_lake_types() -> None:
    def version(column_type: str, data_type: str) -> SchemaVersion:
        m = map_column("qty", data_type, column_type, None, None)
        id_type = schema_type_name(map_column("id", "int", "int(11)", 10, 0).pg_oid, -1)
        return SchemaVersion(
            (
                ColumnVersion("id", id_type, False, False),
                ColumnVersion("qty", schema_type_name(m.pg_oid, m.typmod), True, False),
            ),
            ("id",),
        )

    assert compare(version("int(11)", "int"), version("bigint(20)", "bigint"), CompatibilityMode.BACKWARD).compatible
    assert not compare(
        version("bigint(20)", "bigint"), version("int(11)", "int"), CompatibilityMode.BACKWARD
    ).compatible
    same = compare(version("varchar(20)", "varchar"), version("varchar(40)", "varchar"), CompatibilityMode.FULL)
    assert (same.added, same.dropped, same.retyped, same.problems) == ((), (), (), ())


def _waiting_source(monkeypatch: pytest.MonkeyPatch, cursors: dict[str, TableCursor]) -> Source:
    poll = {"mode": "timestamp", "timestamp_column": "updated_at"}
    config = PlatformConfig.model_validate(_config({"name": "crm.crm.accounts", "poll": poll}))
    source = open_source(config, "crm")
    monkeypatch.setattr(source, "stored_cursors", lambda: cursors)
    return source


SECOND_NS = 1_000_000_000
READ_AT_NS = 1_800_000_000 * SECOND_NS  # the database clock after a check's source read


@pytest.mark.parametrize(
    ("cursor", "answer"),
    [
        (TableCursor("timestamp", caught_up_at=READ_AT_NS + 1), ""),  # a poll after the read reached the end
        (TableCursor("timestamp", caught_up_at=READ_AT_NS - SECOND_NS, stopped=True), "the poller stopped"),
        (TableCursor("timestamp", caught_up_at=READ_AT_NS - 60 * SECOND_NS), "end for 60 s"),  # it died
        (TableCursor("timestamp"), "end yet"),  # it never read the table to the end
    ],
    ids=["caught up", "exited", "silent", "never"],
)
def test_a_check_waiting_for_the_poller_answers_at_once_when_nothing_polls(
    monkeypatch: pytest.MonkeyPatch, cursor: TableCursor, answer: str
) -> None:
    """A check waits for a poll that began after its read (up to 15 s); a poller that
    exited marked its cursors stopped, and one that died has recorded nothing for longer
    than a running one ever leaves (10 s for a quiet table, plus three poll intervals)."""
    source = _waiting_source(monkeypatch, {"crm.crm.accounts": cursor})
    began = time.monotonic()
    said = source.wait_until_captured(READ_AT_NS, began + 5, stop_when_unread=True)
    assert answer in said and (said == "") is (answer == "")
    assert not answer or "cdc-platform capture run --source crm" in said


def test_a_running_poller_is_waited_for_and_verify_waits_its_whole_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poller that read to the end 20 s before the read (a quiet table, within 10 s plus
    three 5 s polls) is running, and so is one that started within that span and has not
    read to the end yet: the check waits for them, up to its deadline. And verify,
    which does not stop early, waits for a stopped poller too (it may be restarting)."""
    recent = TableCursor("timestamp", caught_up_at=READ_AT_NS - 20 * SECOND_NS)
    source = _waiting_source(monkeypatch, {"crm.crm.accounts": recent})
    assert "since the source was read" in source.wait_until_captured(READ_AT_NS, time.monotonic() - 1, True)
    # started a second before the read, after an hour without a poller: its first poll is coming
    started = TableCursor("timestamp", caught_up_at=READ_AT_NS - 3600 * SECOND_NS, started_at=READ_AT_NS - SECOND_NS)
    source = _waiting_source(monkeypatch, {"crm.crm.accounts": started})
    assert "since the source was read" in source.wait_until_captured(READ_AT_NS, time.monotonic() - 1, True)
    stopped = TableCursor("timestamp", caught_up_at=READ_AT_NS - 60 * SECOND_NS, stopped=True)
    source = _waiting_source(monkeypatch, {"crm.crm.accounts": stopped})
    assert "since the source was read" in source.wait_until_captured(READ_AT_NS, time.monotonic() - 1, False)


def test_a_check_waits_for_a_running_poller_longer_than_it_leaves_a_quiet_table() -> None:
    """A poller records reading a quiet table to the end once every 10 s, three polls over
    (25 s at the default 5 s polls), so a check that gave up after 15 s called a running
    poller silent and warned "rows not compared": at the defaults, on most evaluations of a
    quiet table; in CI, under load, at 0.2 s polls. The check waits twice that span for a
    polled source, and 15 s for PostgreSQL, whose slot confirms as capture reads."""
    poll = {"mode": "timestamp", "timestamp_column": "updated_at"}
    polled = open_source(PlatformConfig.model_validate(_config({"name": "crm.crm.accounts", "poll": poll})), "crm")
    quiet_span_s = (CAUGHT_UP_EVERY_NS + 3 * 5 * SECOND_NS) / SECOND_NS  # the default poll_interval_s: 5
    assert polled.confirms_within_s() == quiet_span_s
    assert capture_wait_s(polled) == 2 * quiet_span_s > CAPTURE_WAIT_S
    fast = _config({"name": "crm.crm.accounts", "poll": poll})
    fast["sources"]["crm"]["poll_interval_s"] = 0.2  # type: ignore[index]
    fast_polled = open_source(PlatformConfig.model_validate(fast), "crm")
    assert capture_wait_s(fast_polled) == 2 * (10 + 3 * 0.2) > CAPTURE_WAIT_S  # the test stack's polls
    logical = open_source(PlatformConfig.model_validate(_config({"name": "crm.public.accounts"}, "postgres")), "crm")
    assert capture_wait_s(logical) == CAPTURE_WAIT_S
