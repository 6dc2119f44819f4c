"""The snapshot's SELECT expressions, evaluated by PostgreSQL itself: what a generation reads
for a column is exactly the value capture gives it (the lake types' cases run the whole
path; these are the expressions alone, over many more values than a cases file holds)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_platform.devtools.demo.workload import app_connect
from cdc_platform.devtools.stack import StackProfile
from cdc_platform.envelope.pgtypes import INT64_MAX, INT64_MIN, builtin_type
from cdc_platform.model.tables import LakeColumn
from cdc_platform.sources.postgres.snapshot import column_read

pytestmark = pytest.mark.integration

TIMESTAMPTZ, TIMESTAMP = 1184, 1114
# instants to the microsecond, half within ~95 years of 1970 (mostly the float path's years,
# 1900-2040), half within ~950 years: past 2^53 us (the years after 2255) a float epoch gives
# wrong microseconds for about one instant in 40, so a float path widened that far fails here
SPREADS_MICROS = (3_000_000_000_000_000, 30_000_000_000_000_000)
RANDOM_INSTANTS = 150_000  # per spread


def _read_expression(oid: int) -> str:
    pgtype = builtin_type(oid)
    assert pgtype is not None
    read = column_read(LakeColumn("at", pgtype))
    assert read.conversion == "unix_micros", read
    return read.select_sql.removesuffix(' AS "at"')


@pytest.mark.parametrize(("oid", "kind"), [(TIMESTAMPTZ, "timestamptz"), (TIMESTAMP, "timestamp")])
def test_an_instant_is_read_as_its_exact_microseconds_since_1970(demo_db: StackProfile, oid: int, kind: str) -> None:
    """Random instants to the microsecond over two centuries, the edges of the fast float
    path and of the epoch, infinity and NULL: each read as PostgreSQL's exact (numeric)
    microseconds since 1970, the value capture writes."""
    expression = _read_expression(oid)
    edges = [
        "1900-01-01 00:00:00",
        "1900-01-01 00:00:00.000001",
        "1899-12-31 23:59:59.999999",
        "2040-01-01 00:00:00",
        "2039-12-31 23:59:59.999999",
        "2040-01-01 00:00:00.000001",
        "1970-01-01 00:00:00",
        "1969-12-31 23:59:59.999999",
        "1970-01-01 00:00:00.000001",
        "2026-12-02 01:41:29.123457",
        "4713-11-24 00:00:00 BC",
        "294247-01-10 04:00:54.775806",
    ]  # fmt: skip  (the last: the last microsecond a 64-bit count since 1970 holds)
    zone = "+00" if kind == "timestamptz" else ""
    literals = [f"{e.removesuffix(' BC')}{zone} BC" if e.endswith(" BC") else f"{e}{zone}" for e in edges]
    with app_connect(demo_db) as app:
        app.execute("SET TIME ZONE 'Europe/Paris'")  # the read is UTC's, whatever the session's zone
        app.execute("SELECT setseed(0.17)")
        randoms = " UNION ALL ".join(
            f"""SELECT 'epoch'::{kind} + n * interval '1 microsecond' AS at
                  FROM (SELECT ((random() * 2 - 1) * {spread})::bigint AS n
                          FROM generate_series(1, {RANDOM_INSTANTS})) r"""
            for spread in SPREADS_MICROS
        )
        instants = f"{randoms} UNION ALL SELECT e::{kind} FROM unnest(%s::text[]) e"
        row: Any = app.execute(
            f"""SELECT count(*), count(*) FILTER (WHERE read IS DISTINCT FROM exact),
                       count(*) FILTER (WHERE at > '1900-01-01{zone}'::{kind} AND at < '2040-01-01{zone}'::{kind})
                  FROM (SELECT at, {expression} AS read, (EXTRACT(EPOCH FROM at) * 1000000)::bigint AS exact
                          FROM ({instants}) i) c""",
            (literals,),
        ).fetchone()
        total, wrong, fast = row
        special = app.execute(
            f"SELECT {expression} FROM (VALUES ('infinity'::{kind}), ('-infinity'::{kind}), (NULL::{kind})) v(at)"
        ).fetchall()
    assert total == len(SPREADS_MICROS) * RANDOM_INSTANTS + len(edges)
    assert wrong == 0, f"{wrong} of {total} instants read with the wrong microseconds"
    assert RANDOM_INSTANTS // 2 < fast < total - RANDOM_INSTANTS, (fast, total)  # both paths ran
    assert [r[0] for r in special] == [INT64_MAX, INT64_MIN, None]
