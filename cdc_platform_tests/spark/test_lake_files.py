"""Lake files any engine reads, with the same values through every path (real
PostgreSQL, Kafka, Spark, Delta; delta-rs and DuckDB as the other engines):

* dates in the 1582 calendar gap and instants outside 1677-2262 are the same through the
  snapshot (Spark JDBC) and through capture -> changelog, and equal what PostgreSQL holds
  (read with psycopg, a third path);
* every table type the platform writes (snapshot, changelog, current, history, dead
  letters) reads the same, row for row, in Spark, delta-rs (``to_pyarrow_table``; its
  query engine for current, whose deletion vectors that reader refuses) and
  DuckDB's delta extension: timestamps as TIMESTAMP_MICROS, column mapping only where a
  name needs it;
* a dead letter fails completeness (threshold 0) until ``cdc-platform dead-letters
  --examined`` marks it, and one that arrives later fails it again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from cdc_platform.cli.main import main
from cdc_platform.devtools.lake import Lake
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env
from cdc_platform_tests.spark.readers import delta_rs

pytestmark = [pytest.mark.integration, pytest.mark.spark_codegen]

DDL = ["CREATE TABLE moments (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz, note text)"]
# (date, timestamp, timestamptz): the 1582 gap, its edges, years 1 and 9999, leap days,
# and instants a nanosecond INT96 reading wraps (outside 1677-09-21 .. 2262-04-11)
CASES = [
    ("1582-10-10", "1582-10-10 12:34:56.789", "1582-10-10 12:00:00+00"),
    ("1582-10-04", "1582-10-04 23:59:59.999999", "1582-10-15 00:00:00+01"),
    ("1582-10-15", "1582-10-15 00:00:00", "1582-10-05 00:00:00-03:30"),
    # (timestamptz a day inside years 1 and 9999: PySpark's collect converts instants through
    # datetime.fromtimestamp, which fails on the first and last day Python can represent)
    ("0001-01-01", "0001-01-01 00:00:00", "0001-01-02 00:00:00+00"),
    ("9999-12-31", "9999-12-31 23:59:59.999999", "9999-12-30 23:59:59.999999+00"),
    ("1600-02-29", "1600-06-15 00:00:00.000001", "1600-06-15 00:00:00+05:30"),
    ("1677-09-21", "1677-09-21 00:12:43.145224", "1677-09-21 00:12:43.145224+00"),
    ("2262-04-12", "2262-04-11 23:47:16.854776", "2262-04-11 23:47:16.854776+00"),
    ("2500-01-01", "2500-01-01 12:00:00", "2500-01-01 12:00:00+14"),
    ("1970-01-01", "1969-12-31 23:59:59.999999", "1970-01-01 00:00:00+00"),
]
SHIFT = 100  # the changelog rows: ids SHIFT + case


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    for env in make_capture_env(demo_db, tmp_path, DDL, ["moments"]):
        env.configure_table("moments", "changelog: {grace_s: 0}")
        env.configure_table("moments", "errors: {tolerance: all}")  # dead_letter_threshold 0
        env.configure_table("moments", "history: true")
        yield env


def _insert(env: CaptureEnv, first_id: int) -> None:
    with env.app() as app:
        for i, (d, ts, tz) in enumerate(CASES):
            app.execute("INSERT INTO moments VALUES (%s, %s, %s, %s, 'n')", (first_id + i, d, ts, tz))


def test_dates_and_instants_agree_across_paths_and_engines(env: CaptureEnv, spark: Any) -> None:
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.moments"
    table = lake.table(key)
    env.run_until_caught_up()
    _insert(env, 0)
    lake.snapshot(key, "g1")  # the cases through Spark JDBC
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    _insert(env, SHIFT)  # the same cases through capture and the changelog
    with env.app() as app:
        app.execute("UPDATE moments SET note = 'u' WHERE id = 1")
    producer = Producer({"bootstrap.servers": env.profile.kafka_bootstrap})
    producer.produce(env.topic("moments"), key=b'{"id":999}', value=b"not json", partition=0)  # a dead letter
    assert producer.flush(10) == 0
    env.run_until_caught_up()
    time.sleep(1.1)
    assert lake.window(key, t0, datetime.now(UTC).replace(microsecond=0)).dead_letters == 1
    lake.current(key)

    # 1. the snapshot path and the changelog path give the same value, case by case
    snapshot = {r["id"]: r for r in spark.read.format("delta").load(table.snapshot_path("g1")).collect()}
    changelog = spark.read.format("delta").load(table.changelog_path).where("op = 'c'")
    streamed = {r["after"]["id"] - SHIFT: r["after"] for r in changelog.collect()}
    differing = [
        (i, column, snapshot[i][column], streamed[i][column])
        for i in range(len(CASES))
        for column in ("d", "ts", "tz")
        if _plain(snapshot[i][column]) != _plain(streamed[i][column])
    ]
    assert differing == []

    # 2. and both equal PostgreSQL's own values (psycopg: proleptic Gregorian, like the lake)
    with env.app() as app:
        app.execute("SET TimeZone = 'UTC'")
        source = {r[0]: r[1:] for r in app.execute("SELECT id, d, ts, tz FROM moments").fetchall()}
    current = {r["id"]: (r["d"], r["ts"], r["tz"]) for r in lake.read_current(key).collect()}
    assert {i: tuple(_plain(v) for v in row) for i, row in current.items()} == {
        i: tuple(_plain(v) for v in row) for i, row in source.items()
    }
    assert source[0][0] == date(1582, 10, 10)  # the case the JDBC path shifted by ten days

    # completeness compares values: the old snapshot path's ten-day shift in current fails it
    from pyspark.sql import functions as F

    with env.running_capture():
        unexamined = lake.completeness(key)
        assert main(["dead-letters", key, "--examined", "--config", str(env.config_path)]) == 0
        clean = lake.completeness(key)
        shifted = F.when(F.col("id") == 0, F.date_add("d", 10)).otherwise(F.col("d"))
        lake.replace_current(key, lambda current: current.withColumn("d", shifted))
        broken = lake.completeness(key)
    assert not unexamined.passed and (unexamined.dead_letters, unexamined.max_dead_letters_per_window) == (1, 1)
    assert "--examined" in (unexamined.description(key, polled=False) or "")
    assert clean.passed and clean.compared and clean.compared_rows == 2 * len(CASES), clean.compare_note
    assert (clean.dead_letters, clean.dead_letters_examined) == (0, 1)
    assert not broken.passed and (broken.differing, broken.sample) == (1, ['differs {"id": 0}'])

    # 3. every table type reads the same in Spark, delta-rs and DuckDB
    paths = {
        "snapshot": table.snapshot_path("g1"), "changelog": table.changelog_path, "current": table.current_path,
        "history": table.history_path, "dead_letters": table.dead_letters_path,
    }  # fmt: skip
    for kind, path in paths.items():
        in_spark = _rows([r.asDict(recursive=True) for r in spark.read.format("delta").load(path).collect()])
        assert in_spark, kind
        assert _rows(_delta_rs(path)) == in_spark, f"{kind}: delta-rs reads other values than Spark"
        assert _rows(_duckdb(path)) == in_spark, f"{kind}: DuckDB reads other values than Spark"

    # 4. a dead letter after the examination counts again
    t1 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    producer.produce(env.topic("moments"), key=b'{"id":998}', value=b"not json either", partition=0)
    assert producer.flush(10) == 0
    time.sleep(1.1)
    assert lake.window(key, t1, datetime.now(UTC).replace(microsecond=0)).dead_letters == 1
    with env.running_capture():
        again = lake.completeness(key)
    assert (again.dead_letters, again.dead_letters_examined, again.max_dead_letters_per_window) == (1, 1, 1)
    assert (again.description(key, polled=False) or "").startswith("1 dead letter(s) not examined")


def _delta_rs(path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = delta_rs(path).to_pylist()
    return rows


def _duckdb(path: str) -> list[dict[str, Any]]:
    import duckdb
    from duckdb_extensions import import_extension

    import_extension("delta")
    with duckdb.connect() as db:
        db.execute("LOAD delta")
        db.execute("SET TimeZone = 'UTC'")
        cursor = db.execute("SELECT * FROM delta_scan(?)", [path])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _rows(rows: list[dict[str, Any]]) -> list[str]:
    """Rows as sorted, engine-neutral text: instants in UTC without a zone object."""
    return sorted(repr(sorted((k, _plain(v)) for k, v in row.items())) for row in rows)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, dict):
        return sorted((k, _plain(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def test_a_checkpoint_delta_rs_wrote_over_sparks_reads_in_spark(spark: Any, tmp_path: Path) -> None:
    """Both engines write one table (Spark's jobs and MERGE; the driver's appends and merges
    by delta-rs), and both write checkpoints. Hadoop's checksummed local filesystem keeps a
    ``._last_checkpoint.crc`` beside Spark's ``_last_checkpoint``, which delta-rs rewrites
    without it: every Spark that loaded the table afresh (the apply's start, each check
    run, a log evicted from Delta's cache) failed the checksum three times a second apart
    and logged the checkpoint as corrupted. Here the driver's appends (the apply's path)
    write a checkpoint over Spark's, and ``_last_checkpoint`` is read as Delta reads it:
    through the session's filesystem for the lake's path."""
    import json

    import pyarrow as pa

    from cdc_platform.lake.driver_append import append_in_driver
    from cdc_platform.lake.tables import lake_table
    from cdc_platform_tests.spark.test_apply import load_config_text

    config = load_config_text(tmp_path)
    table = lake_table(config, config.tables[0])
    path = table.changelog_path
    spark.range(3).write.format("delta").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    spark.range(3, 6).write.format("delta").mode("append").save(path)  # version 2: Spark's checkpoint
    log = Path(path) / "_delta_log"
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 2
    assert (log / "._last_checkpoint.crc").exists()  # Hadoop's, beside Spark's
    for number in (1, 2):  # versions 3 and 4: delta-rs writes a checkpoint on its interval
        rows = pa.table({"id": pa.array([5 + number], pa.int64())})
        assert append_in_driver(table, lambda rows=rows: rows, f"batch#{number}", "cdc_platform.apply.t", number)
    newest = json.loads((log / "_last_checkpoint").read_text())["version"]
    assert newest > 2  # delta-rs' checkpoint, over Spark's

    jvm = spark.sparkContext._jvm
    last = jvm.org.apache.hadoop.fs.Path(f"file://{log / '_last_checkpoint'}")
    stream = last.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(last)
    try:
        text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
    assert json.loads(text)["version"] == newest
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == list(range(8))


def test_hadoops_checksum_is_computed_as_hadoop_writes_it(spark: Any, tmp_path: Path) -> None:
    """``lake/checksums.py`` keeps a checksum that matches and drops one that does not: both
    need its reckoning to be Hadoop's, byte for byte (a file over one 512-byte chunk)."""
    from cdc_platform.lake.checksums import drop_stale_checkpoint_checksum, hadoop_checksum

    path = tmp_path / "t"
    spark.range(40).write.format("delta").option("delta.checkpointInterval", "1").save(str(path))
    spark.range(40, 80).write.format("delta").mode("append").save(str(path))  # with Spark's checkpoint
    log = path / "_delta_log"
    written = sorted(log.glob(".*.json.crc"))
    assert written and all(hadoop_checksum((log / c.name[1:-4]).read_bytes()) == c.read_bytes() for c in written)
    assert not drop_stale_checkpoint_checksum(str(path)) and (log / "._last_checkpoint.crc").exists()
    (log / "_last_checkpoint").write_text((log / "_last_checkpoint").read_text().replace("}", ', "x": 1}', 1))
    assert drop_stale_checkpoint_checksum(str(path)) and not (log / "._last_checkpoint.crc").exists()
