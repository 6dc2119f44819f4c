"""Snapshot generations on the real stack: exact types, parallel and consistent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.lake import Lake
from cdc_platform.lake import snapshot as snapshot_module
from cdc_platform.sources.postgres import snapshot as pg_snapshot_module
from cdc_platform_tests.cases.pg_types import TYPE_CASES, type_cases_ddl
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    ddl = [
        *type_cases_ddl(),
        "CREATE TABLE events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), n int NOT NULL)",
        "CREATE TABLE counters (id bigint PRIMARY KEY, n int NOT NULL)",
    ]
    yield from make_capture_env(demo_db, tmp_path, ddl, ["type_cases", "events", "counters"])


def _lake_expected(value: Any, sqltype: str, as_text: str) -> Any:
    """What the lake must hold for a PostgreSQL value (see cdc_platform/lake/lake_types.py)."""
    if sqltype in ("numeric", "interval", "time", "uuid", "json", "jsonb", "cap_mood", "inet", "uuid[]"):
        return as_text if not sqltype.endswith("[]") else [str(v) for v in value]
    if sqltype == "time with time zone":
        return "04:30:00.25Z"
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)  # Spark returns UTC-naive datetimes here
    if sqltype == "real":
        return pytest.approx(float(as_text), rel=1e-7)
    if sqltype == "cap_mood[]":
        return ["happy", "sad"]
    return value


def test_every_type_case_lands_exactly(env: CaptureEnv, spark: Any) -> None:
    with env.app() as app:
        for name, _, literal in TYPE_CASES:
            app.execute(f"INSERT INTO type_cases (case_name, {name}) VALUES ('{name}', {literal})".encode())
    result = Lake(env.config, spark).snapshot(f"cap.{env.schema}.type_cases", "g1")
    assert result.rows == result.source_rows == len(TYPE_CASES)
    lake = {r["case_name"]: r.asDict() for r in spark.read.format("delta").load(result.path).collect()}
    problems = []
    with env.app() as app:
        app.execute("SET intervalstyle = iso_8601")
        for name, sqltype, _ in TYPE_CASES:
            selected = f"{name}::text" if sqltype == "interval" else name  # psycopg cannot parse ISO intervals
            row = app.execute(f"SELECT {selected}, {name}::text FROM type_cases WHERE case_name = %s".encode(), (name,))
            value, as_text = row.fetchone() or (None, None)
            expected = _lake_expected(value, sqltype, as_text)
            got = lake[name][name]
            if sqltype.startswith("numeric(8,2)[]"):
                expected = [Decimal("1.50"), Decimal("-2.25")]
            if got != expected:
                problems.append(f"{name} ({sqltype}): lake {got!r}, postgres {as_text!r}")
    assert not problems, "\n".join(problems)


def test_parallel_snapshot_is_one_consistent_state(
    env: CaptureEnv, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with env.app() as app:
        app.execute("INSERT INTO events (n) SELECT g FROM generate_series(1, 3000) g")
        app.execute("INSERT INTO counters SELECT g, 0 FROM generate_series(1, 3000) g")
    monkeypatch.setattr(pg_snapshot_module, "ROWS_PER_PARTITION", 500)  # force several partitions
    monkeypatch.setattr(snapshot_module, "PROGRESS_INTERVAL_S", 0.05)
    progress: list[str] = []

    stop = threading.Event()

    def writer() -> None:  # keeps changing both tables while the snapshot reads
        with env.app() as app:
            i = 0
            while not stop.is_set():
                i += 1
                app.execute("INSERT INTO events (n) VALUES (%s)", (-i,))
                app.execute("UPDATE counters SET n = n + 1")  # every row, one transaction
                time.sleep(0.01)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        lake = Lake(env.config, spark)
        events = lake.table(f"cap.{env.schema}.events")
        request = snapshot_module.GenerationRequest("g1", reason="test")
        uuid_result = snapshot_module.take_generation(
            spark, lake.ledger, lake.source(events.key), lake.kafka, events, request, progress.append
        )
        counters_result = lake.snapshot(f"cap.{env.schema}.counters", "g1")
    finally:
        stop.set()
        thread.join()
    assert uuid_result.spark_partitions > 1 and counters_result.spark_partitions > 1
    # long reads report progress: tasks done of tasks, and the share of rows that represents
    assert any("Spark tasks done" in line and "rows)" in line for line in progress), progress
    assert uuid_result.rows == uuid_result.source_rows >= 3000  # hash buckets cover every row once
    counters = spark.read.format("delta").load(counters_result.path)
    # one transaction updates every row: a consistent snapshot sees one value across all partitions
    assert counters.select("n").distinct().count() == 1
    assert counters.count() == 3000
    assert counters_result.watermark.position > 0
    assert set(uuid_result.watermark.kafka_end_offsets) <= {0, 1, 2}
