"""Every value PostgreSQL accepts arrives exact (real PostgreSQL, Kafka, Spark, Delta).

The edge cases file (``cases/pg_edges.py``, one row per case) goes through the snapshot
(Spark JDBC) and through capture -> changelog -> current. Each case is compared with
PostgreSQL's own value, and the two paths with each other, in integers where Python's
types stop (days and microseconds since 1970: BC, years past 9999, ±infinity as the
extreme integers, as the README's type table says). Money is read back under another
locale's ``lc_monetary``. Values the lake refuses by design are refused loudly in both
paths: a dead letter with the reason, a generation that fails naming the column."""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from psycopg import sql

from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack.postgres import CAPTURE_ROLE
from cdc_platform.model.errors import CdcError
from cdc_platform_tests.cases.pg_edges import EDGE_CASES, EDGE_COLUMNS, REFUSED_CASES, edge_cases_ddl
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.spark.readers import delta_rs, duckdb_table

pytestmark = [pytest.mark.integration, pytest.mark.spark_codegen]

INT32 = (2**31 - 1, -(2**31))
INT64 = (2**63 - 1, -(2**63))


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, edge_cases_ddl(), ["edge_cases"]):
        env.configure_table("edge_cases", "changelog: {grace_s: 0}")
        env.configure_table("edge_cases", "errors: {tolerance: all}")
        # capture and snapshot connect as this role: its sessions format money the German way
        with env.admin() as admin:
            admin.execute(sql.SQL("ALTER ROLE {} SET lc_monetary = 'de_DE.UTF-8'").format(sql.Identifier(CAPTURE_ROLE)))
        try:
            yield env
        finally:
            with env.admin() as admin:
                admin.execute(sql.SQL("ALTER ROLE {} RESET lc_monetary").format(sql.Identifier(CAPTURE_ROLE)))


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _insert(env: CaptureEnv, prefix: str, cases: list[tuple[str, str, str]]) -> None:
    with env.app() as app:
        for name, column, literal in cases:
            app.execute(
                f"INSERT INTO edge_cases (case_name, {column}) VALUES (%s, {literal})".encode(), (prefix + name,)
            )


def test_every_edge_value_is_exact_through_snapshot_and_changelog(env: CaptureEnv, spark: Any) -> None:
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.edge_cases"
    table = lake.table(key)
    env.run_until_caught_up()
    _insert(env, "s:", EDGE_CASES)
    lake.snapshot(key, "g1")
    t0 = _now() - timedelta(seconds=1)
    _insert(env, "c:", EDGE_CASES)
    env.run_until_caught_up()
    time.sleep(1.1)
    window = lake.window(key, t0, _now())
    # both sets of rows reach Kafka after t0 (capture ran after both inserts): none is a dead letter
    assert (window.dead_letters, window.events) == (0, {"c": 2 * len(EDGE_CASES)})
    lake.current(key)

    source = _source_values(env)
    assert len(source) == 2 * len(EDGE_CASES)
    snapshot = _lake_values(spark.read.format("delta").load(table.snapshot_path("g1")))
    changelog = spark.read.format("delta").load(table.changelog_path).where("op = 'c'").select("after.*")
    streamed = _lake_values(changelog)
    current = _lake_values(lake.read_current(key))

    columns = dict((name, column) for name, column, _ in EDGE_CASES)
    differing = _differing(source, "s:", {"snapshot": snapshot, "current, snapshot row": current})
    differing += _differing(source, "c:", {"changelog": streamed, "current, changelog row": current})
    assert differing == []
    # the other columns of every row stayed NULL through both paths
    assert all(v is None for n, row in current.items() for c, v in row.items() if c != columns[n[2:]])
    _assert_read_alike_by_other_engines(
        {
            table.snapshot_path("g1"): snapshot,
            table.changelog_path: streamed,
            table.current_path: current,
        },
        ("s:", "c:"),
    )

    # spot checks of the representations the README's type table documents
    assert source["s:date_infinity"]["d"] == str(INT32[0]) and source["s:ts_minus_infinity"]["ts"] == str(INT64[1])
    assert source["s:date_first"]["d"] == "-2440588"  # 4714-11-24 BC: Julian day 0
    assert source["s:money_thousands"]["m"] == "1234.56" and source["s:json_duplicate_keys"]["j"] == '{"a": 1, "a": 2}'


def test_every_edge_value_is_exact_through_the_stream_apply(env: CaptureEnv, spark: Any) -> None:
    """A stream batch (``cdc-platform apply``'s path): decoded in the JVM, appended to the
    changelog by delta-rs in the driver (``lake.driver_append``) and merged into current
    there too (``lake.driver_merge``), every case keeps PostgreSQL's value."""
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.edge_cases"
    table = lake.table(key)
    env.run_until_caught_up()
    lake.snapshot(key, "g1")  # empty: every row comes through the stream
    _insert(env, "w:", EDGE_CASES[:1])
    env.run_until_caught_up()
    with env.stream_apply(spark) as engine:
        engine.run_until_caught_up()  # the first batch creates the changelog: Spark's append
        _insert(env, "c:", EDGE_CASES)
        env.run_until_caught_up()
        engine.run_until_caught_up()
    history = DeltaTable(table.changelog_path).history()
    appends = [str(c.get("engineInfo", "")) for c in history if c.get("operation") == "WRITE"]
    assert len(appends) == 2 and appends[0].startswith("delta-rs"), appends  # newest first: the cases' batch

    source = _source_values(env)
    changelog = spark.read.format("delta").load(table.changelog_path).where("op = 'c'").select("after.*")
    streamed, current = _lake_values(changelog), _lake_values(lake.read_current(key))
    assert len(streamed) == len(current) == len(EDGE_CASES) + 1
    assert _differing(source, "c:", {"changelog": streamed, "current": current}) == []
    _assert_read_alike_by_other_engines({table.changelog_path: streamed, table.current_path: current}, ("c:",))


def _differing(
    source: dict[str, dict[str, Any]], prefix: str, lake: dict[str, dict[str, dict[str, Any]]]
) -> list[tuple[str, str, Any, Any]]:
    """Each case's value (rows named ``prefix`` + case) where a lake table has another than PostgreSQL's."""
    differing = []
    for name, column, _ in EDGE_CASES:
        want = source[prefix + name][column]
        differing += [(name, where, want, rows[prefix + name][column]) for where, rows in lake.items()
                      if rows[prefix + name][column] != want]  # fmt: skip
    return differing


def _assert_read_alike_by_other_engines(
    tables: dict[str, dict[str, dict[str, Any]]], prefixes: tuple[str, ...]
) -> None:
    """delta-rs (to_pyarrow_table) and DuckDB read every table type with the same days and
    microseconds as Spark (BC, past 9999, ±infinity); delta-rs failed on BC date statistics.
    ``tables``: each table's path and the values Spark read from it."""
    temporal = [(prefix + name, column) for name, column, _ in EDGE_CASES if column in ("d", "ts", "tz")
                for prefix in prefixes]  # fmt: skip
    for path, in_spark in tables.items():
        want = {(case, column): in_spark[case][column] for case, column in temporal if case in in_spark}
        for engine, arrow in (("delta-rs", delta_rs(path)), ("duckdb", duckdb_table(path))):
            read = _temporal_integers(arrow)
            assert {(case, c): read[case][c] for case, c in want} == want, (path, engine)


def test_values_the_lake_refuses_are_refused_loudly_in_both_paths(env: CaptureEnv, spark: Any) -> None:
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.edge_cases"
    env.run_until_caught_up()
    lake.snapshot(key, "g0")  # the table's committed generation (empty)
    t0 = _now() - timedelta(seconds=1)
    for n, (name, column, literal, reason) in enumerate(REFUSED_CASES):
        _insert(env, "", [(name, column, literal)])
        # the snapshot: the generation fails naming the column and the fix, never a NULL in the lake
        with pytest.raises(CdcError, match=reason) as info:
            lake.snapshot(key, f"refused{n}")
        assert info.value.kind == "fatal", info.value
        assert "generation again" in str(info.value)
        with env.app() as app:
            app.execute("DELETE FROM edge_cases WHERE case_name = %s", (name,))
    env.run_until_caught_up()
    time.sleep(1.1)
    # the changelog: each insert a dead letter with its reason; the deletes apply
    window = lake.window(key, t0, _now())
    assert window.dead_letters == len(REFUSED_CASES)
    assert window.events == {"d": len(REFUSED_CASES), "tombstone": len(REFUSED_CASES)}
    errors = [r["error"] for r in spark.read.format("delta").load(lake.table(key).dead_letters_path).collect()]
    for _, column, _, reason in REFUSED_CASES:
        assert any(column in e and (reason in e or "64-bit" in e) for e in errors), (column, errors)


def _temporal_integers(arrow: Any) -> dict[str, dict[str, str | None]]:
    """Dates as days and instants as microseconds since 1970, read from Arrow's raw integers
    (a changelog's row image is its ``after`` struct; its deletes have none)."""
    import pyarrow as pa

    if "after" in arrow.column_names:
        arrow = pa.Table.from_struct_array(arrow["after"].combine_chunks()).filter(
            pa.compute.is_valid(arrow["after"].combine_chunks())
        )
    width = {"d": pa.int32(), "ts": pa.int64(), "tz": pa.int64()}
    columns = {name: arrow[name].cast(kind).to_pylist() for name, kind in width.items()}
    return {
        case: {name: None if values[i] is None else str(values[i]) for name, values in columns.items()}
        for i, case in enumerate(arrow["case_name"].to_pylist())
    }


def _source_values(env: CaptureEnv) -> dict[str, dict[str, Any]]:
    """PostgreSQL's values in the lake's documented terms, computed by PostgreSQL."""
    expressions = [_source_expression(name, sqltype) for name, sqltype in EDGE_COLUMNS]
    with env.app() as app:
        app.execute("SET TimeZone = 'UTC'")
        app.execute("SET IntervalStyle = 'iso_8601'")
        cursor = app.execute(f"SELECT case_name, {', '.join(expressions)} FROM edge_cases".encode())
        names = [d.name for d in cursor.description or ()]
        rows = cursor.fetchall()
    kinds = dict(EDGE_COLUMNS)
    return {row[0]: {n: _canonical(kinds[n], v) for n, v in zip(names[1:], row[1:], strict=True)} for row in rows}


def _source_expression(name: str, sqltype: str) -> str:
    if sqltype == "date":
        return _infinite(name, INT32, f"({name} - DATE '1970-01-01')::text")
    if sqltype in ("timestamp", "timestamptz"):
        return _infinite(name, INT64, f"(EXTRACT(EPOCH FROM {name}) * 1000000)::numeric(30, 0)::text")
    if sqltype == "timetz":  # the lake's time of day in UTC with Z
        return f"regexp_replace(({name} AT TIME ZONE 'UTC')::text, '\\+00$', 'Z') AS {name}"
    if sqltype == "money":
        return f"{name}::numeric::text AS {name}"
    if sqltype.endswith("[]") or sqltype == "edge_ints":
        return f"to_json({name})::text AS {name}"
    return f"{name}::text AS {name}"


def _infinite(name: str, extremes: tuple[int, int], finite: str) -> str:
    top, bottom = extremes
    return (
        f"CASE WHEN {name} = 'infinity' THEN '{top}' WHEN {name} = '-infinity' THEN '{bottom}' "
        f"ELSE {finite} END AS {name}"
    )


def _lake_values(frame: Any) -> dict[str, dict[str, Any]]:
    """The lake's values in the same terms, computed by Spark (integers for dates and instants)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    selected = [F.col("case_name")]
    for field in frame.schema.fields:
        column = F.col(field.name)
        if field.name == "case_name":
            continue
        if isinstance(field.dataType, T.DateType):
            column = F.unix_date(column).cast("string")
        elif isinstance(field.dataType, T.TimestampNTZType | T.TimestampType):
            column = F.unix_micros(column.cast("timestamp")).cast("string")
        elif isinstance(field.dataType, T.ArrayType):
            column = F.to_json(column)
        elif not isinstance(field.dataType, T.FloatType | T.DoubleType):
            column = column.cast("string")
        selected.append(column.alias(field.name))
    kinds = dict(EDGE_COLUMNS)
    return {
        row["case_name"]: {n: _canonical(kinds[n], v) for n, v in row.asDict().items() if n != "case_name"}
        for row in frame.select(*selected).collect()
    }


def _canonical(sqltype: str, value: Any) -> Any:
    """One comparable form per value: floats by their bits at the column's width (NaN as
    'nan', -0.0 kept), JSON arrays parsed with exact decimals, the rest as text."""
    if value is None:
        return None
    if sqltype in ("real", "double precision"):
        number = float(value)
        if sqltype == "real":
            number = struct.unpack("<f", struct.pack("<f", number))[0]
        return "nan" if math.isnan(number) else repr(number)
    if sqltype.endswith("[]") or sqltype == "edge_ints":
        return json.loads(value, parse_float=Decimal)
    return str(value)
