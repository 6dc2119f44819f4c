"""SCD2 history on the real stack: one version per change, closed by the next change of
its key, TOASTed values carried, duplicates ignored, kept across generations, truncates
close everything older."""

from __future__ import annotations

import itertools
import random
import string
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.lake import Lake
from cdc_platform.lake.compare import RowComparison, compare_history, history_chain
from cdc_platform.lake.history import HISTORY_META_COLUMNS, apply_history
from cdc_platform.model.tables import TableSchema
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = pytest.mark.integration

DDL = [
    "CREATE TABLE items (id int PRIMARY KEY, body text, qty int NOT NULL DEFAULT 0)",
    # big: random text well above the TOAST threshold, so an update of n does not resend it
    "CREATE TABLE docs (id int PRIMARY KEY, big text, n int)",
]


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    yield from make_capture_env(demo_db, tmp_path, DDL, ["items", "docs"])


class Windows:
    """Consecutive closed changelog windows: each call covers what happened since the last."""

    def __init__(self) -> None:
        self.start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)

    def materialize(self, env: CaptureEnv, lake: Lake, keys: list[str]) -> None:
        env.run_until_caught_up()
        time.sleep(1.1)
        end = datetime.now(UTC).replace(microsecond=0)
        for key in keys:
            lake.window(key, self.start, end)
        self.start = end


def _versions(spark: Any, lake: Lake, key: str) -> dict[int, list[dict[str, Any]]]:
    rows = spark.read.format("delta").load(lake.table(key).history_path).collect()
    out: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (r["_cdc_commit_lsn"], r["_cdc_lsn"])):
        out.setdefault(row["id"], []).append(row.asDict())
    return out


def _history_check(lake: Lake, table: str) -> RowComparison:
    """The platform's history check (``open_versions_match_current``), as the current asset runs it."""
    committed = lake.ledger.committed(table)
    assert committed is not None
    schema = TableSchema.from_json(committed.schema_json)
    checked = compare_history(lake.spark, lake.ledger, lake.kafka, lake.table(table), schema)
    assert checked.rows is not None, checked.note
    return checked.rows


def _assert_consistent(spark: Any, lake: Lake, table: str) -> None:
    """Open versions are exactly current; each key's versions chain without gaps."""
    history = spark.read.format("delta").load(lake.table(table).history_path)
    current = lake.read_current(table)
    open_rows = history.where("is_current").drop(*HISTORY_META_COLUMNS)
    assert (open_rows.exceptAll(current).count(), current.exceptAll(open_rows).count()) == (0, 0)
    chain = history_chain(spark, lake.table(table), ["id"])  # the product's check of what follows
    assert chain.versions > 0 and chain.faults == 0, chain
    for key, versions in _versions(spark, lake, table).items():
        assert sum(v["is_current"] for v in versions) <= 1, key
        for older, newer in itertools.pairwise(versions):
            assert not older["is_current"], key
            if older["_cdc_end_commit_lsn"] == newer["_cdc_commit_lsn"] and older["_cdc_end_lsn"] == newer["_cdc_lsn"]:
                assert older["valid_to"] == newer["valid_from"], key
            assert (older["_cdc_end_commit_lsn"], older["_cdc_end_lsn"]) <= (
                newer["_cdc_commit_lsn"],
                newer["_cdc_lsn"],
            ), key


@pytest.mark.long_running
def test_history_versions_follow_every_change(env: CaptureEnv, spark: Any) -> None:
    for t in ("items", "docs"):
        env.configure_table(t, "changelog: {grace_s: 0}")
        env.configure_table(t, "history: true")
    lake = Lake(env.config, spark)
    items, docs = (f"cap.{env.schema}.{t}" for t in ("items", "docs"))
    big = "".join(random.Random(7).choices(string.ascii_letters, k=20_000))
    with env.app() as app:
        app.execute("INSERT INTO items VALUES (1, 'b1', 0), (2, 'b2', 0), (3, 'b3', 0)")
        app.execute("INSERT INTO items SELECT g, 'untouched', 0 FROM generate_series(100, 149) g")
    env.run_until_caught_up()
    windows = Windows()
    for key in (items, docs):
        lake.snapshot(key, "g1")
        first = lake.current(key)
        assert first.history is not None
    assert first.history is not None and first.history.versions_opened == 0  # docs: empty snapshot

    with env.app() as app:
        app.execute("UPDATE items SET body = 'a2' WHERE id = 1")
        app.execute("UPDATE items SET qty = 7 WHERE id = 1")
        app.execute("DELETE FROM items WHERE id = 2")
        app.execute("INSERT INTO items VALUES (4, 'b4', 4)")
        app.execute("UPDATE items SET id = 5 WHERE id = 4")  # key change: d(4) + c(5)
        with app.transaction():
            app.execute("UPDATE items SET body = 'x' WHERE id = 3")
            app.execute("UPDATE items SET body = 'y' WHERE id = 3")
        app.execute("INSERT INTO docs VALUES (1, %s, 0)", (big,))
        app.execute("UPDATE docs SET n = 1 WHERE id = 1")  # big is not resent (unchanged TOAST)
    windows.materialize(env, lake, [items, docs])
    result = lake.current(items)
    assert result.history is not None
    assert (result.history.versions_opened, result.history.versions_closed) == (6, 6)
    # a history this small is sequenced in the driver and merged by delta-rs (``driver_history``):
    # it rewrites the file holding the versions it closes, so no deletion vector is left behind.
    # A bigger one goes through Spark's MERGE, which marks them in deletion vectors instead
    from delta.tables import DeltaTable

    merged = DeltaTable.forPath(spark, lake.table(items).history_path).history(1).first()
    assert merged is not None and merged["operation"] == "MERGE", merged
    assert str(merged["engineInfo"]).startswith("delta-rs"), merged
    assert not list(Path(lake.table(items).history_path).glob("deletion_vector_*.bin"))
    lake.current(docs)

    versions = _versions(spark, lake, items)
    assert [(v["body"], v["qty"], v["_cdc_op"], v["is_current"]) for v in versions[1]] == [
        ("b1", 0, "r", False),
        ("a2", 0, "u", False),
        ("a2", 7, "u", True),
    ]
    assert [(v["body"], v["is_current"], v["valid_to"] is not None) for v in versions[2]] == [("b2", False, True)]
    assert [(v["body"], v["_cdc_op"]) for v in versions[3]] == [("b3", "r"), ("x", "u"), ("y", "u")]
    assert versions[3][1]["valid_from"] == versions[3][1]["valid_to"]  # same transaction, same commit time
    assert [(v["body"], v["is_current"]) for v in versions[4]] == [("b4", False)]
    assert [(v["body"], v["is_current"]) for v in versions[5]] == [("b4", True)]
    assert [(v["big"], v["n"]) for v in _versions(spark, lake, docs)[1]] == [(big, 0), (big, 1)]
    _assert_consistent(spark, lake, items)
    _assert_consistent(spark, lake, docs)

    # at-least-once: the same events again add nothing
    before = spark.read.format("delta").load(lake.table(items).history_path).count()
    again = spark.read.format("delta").load(lake.table(items).changelog_path).where("op IS NOT NULL")
    columns = [
        c for c in spark.read.format("delta").load(lake.table(items).current_path).columns if not c.startswith("_")
    ]
    duplicate = apply_history(spark, lake.table(items).history_path, again, ["id"], columns)
    assert (duplicate.versions_opened, duplicate.versions_closed) == (0, 0)
    assert spark.read.format("delta").load(lake.table(items).history_path).count() == before

    # a new generation keeps history: unchanged rows add nothing, changes the changelog has
    # not delivered yet are reconciled from the snapshot (vanished rows closed)
    with env.app() as app:
        app.execute("DELETE FROM items WHERE id = 3")
        app.execute("UPDATE items SET body = 'g3' WHERE id = 1")
    env.run_until_caught_up()
    lake.snapshot(items, "g2")
    rebuilt = lake.current(items)
    assert rebuilt.rebuilt and rebuilt.history is not None
    assert (rebuilt.history.versions_opened, rebuilt.history.versions_closed) == (1, 2)
    versions = _versions(spark, lake, items)
    assert [(v["body"], v["_cdc_op"], v["is_current"]) for v in versions[1]][-2:] == [
        ("a2", "u", False),
        ("g3", "r", True),
    ]
    assert not any(v["is_current"] for v in versions[3])
    _assert_consistent(spark, lake, items)

    # truncate closes every open version; later rows open new ones
    with env.app() as app:
        app.execute("TRUNCATE items")
        app.execute("INSERT INTO items SELECT g, 'after', 0 FROM generate_series(9, 12) g")
    windows.materialize(env, lake, [items])
    after = lake.current(items)
    assert after.history is not None and after.history.versions_opened == 4
    assert sorted(
        r["id"] for r in spark.read.format("delta").load(lake.table(items).history_path).where("is_current").collect()
    ) == [9, 10, 11, 12]
    _assert_consistent(spark, lake, items)
    _the_history_check_finds_a_history_that_does_not_match(env, lake, items)


def _the_history_check_finds_a_history_that_does_not_match(env: CaptureEnv, lake: Lake, key: str) -> None:
    """History is written beside current, by its own MERGE: a bug there (a version not
    opened, one not closed, a wrong value) left history wrong with every check green,
    since the checks looked at current alone. The history check finds each, and leaves
    out a key changed beyond the frontier both applied (in Kafka, not yet applied)."""
    from pyspark.sql import functions as F

    clean = _history_check(lake, key)
    assert (clean.compared, clean.missing, clean.extra, clean.differing, clean.repeated) == (4, 0, 0, 0, 0)
    with env.app() as app:
        app.execute("UPDATE items SET qty = 9 WHERE id = 9")
    env.run_until_caught_up()
    assert _history_check(lake, key).compared == 3  # 9 is in flight
    path = lake.table(key).history_path
    history = lake.spark.read.format("delta").load(path)
    is_current, first_of_1 = F.col("is_current"), (F.col("id") == 1) & (F.col("body") == "b1")
    second_of_1 = (F.col("id") == 1) & (F.col("body") == "a2") & (F.col("qty") == 0)
    tampered = (
        history.withColumn("qty", F.when(is_current & (F.col("id") == 10), F.lit(99)).otherwise(F.col("qty")))
        .withColumn("is_current", F.when(F.col("id") == 11, F.lit(False)).otherwise(is_current))
        .unionByName(history.where(is_current & (F.col("id") == 12)).withColumn("body", F.lit("twin")))
        # closed versions the open ones' comparison cannot see: one ending after the next begins,
        # one valid until an hour before the next is valid from
        .withColumn("_cdc_end_lsn", F.col("_cdc_end_lsn") + F.when(first_of_1, 10**9).otherwise(0))
        .withColumn("valid_to", F.when(second_of_1, F.col("valid_to") - F.expr("INTERVAL 1 HOUR")).otherwise(
            F.col("valid_to")))
    )  # fmt: skip
    tampered.localCheckpoint().write.format("delta").mode("overwrite").save(path)
    broken = _history_check(lake, key)
    assert (broken.differing, broken.extra, broken.repeated, broken.missing) == (1, 1, 1, 1), broken.sample
    expected = {'differs {"id": 10}', 'extra {"id": 11}', 'repeated in the source {"id": 12}'}
    assert set(broken.sample) == expected, broken.sample
    chain = history_chain(lake.spark, lake.table(key), ["id"])
    found = (chain.starting_twice, chain.overlapping, chain.without_end, chain.misdated)
    assert found == (1, 1, 1, 1) and chain.versions == lake.spark.read.format("delta").load(path).count(), chain
    assert set(chain.sample) == {
        'starting twice {"id": 12}', 'overlapping {"id": 1}', 'without end {"id": 11}', 'misdated {"id": 1}'
    }, chain.sample  # fmt: skip
    # the open versions' fix its description names: a new generation corrects every open version,
    # the key with two of them included; closed versions it never rewrites (that check's fix is RESTORE)
    lake.snapshot(key, "g3")
    lake.current(key)
    repaired = _history_check(lake, key)
    assert (repaired.compared, repaired.missing, repaired.extra, repaired.differing, repaired.repeated) == (
        4, 0, 0, 0, 0
    ), repaired.sample  # fmt: skip
    assert history_chain(lake.spark, lake.table(key), ["id"]).faults > 0


@pytest.fixture(params=["driver", "spark"], ids=["sequenced in the driver, merged by delta-rs", "applied by Spark"])
def history_path(request: pytest.FixtureRequest) -> str:
    """A small history takes a batch in the driver (``lake.driver_history``); a truncate, a
    big history or a refusal sends it through Spark (``history.apply_history``). Both keep
    every rule the tests below hold history to."""
    return str(request.param)


def apply_batch(spark: Any, path: str, table: Any, events: Any, keys: list[str], columns: list[str]) -> Any:
    """``events`` into ``table``'s history along ``path`` as ``current.merge_changes``
    applies a batch; in the driver, every batch without a truncate must be taken there."""
    from pyspark.sql import functions as F

    from cdc_platform.lake.driver_history import HISTORY_EVENT_COLUMNS, apply_history_in_driver
    from cdc_platform.lake.driver_merge import collected_events

    if path == "driver":
        applied = apply_history_in_driver(table, collected_events(events, HISTORY_EVENT_COLUMNS), keys, columns)
        if applied is not None:
            return applied
        assert events.where(F.col("op") == "t").count() > 0, "the driver refused a batch without a truncate"
    return apply_history(spark, table.history_path, events, keys, columns)


def assert_written_by(path: str, history_path: str) -> None:
    """History's version commits are delta-rs' on the driver path (some: a truncate's are
    Spark's) and Spark's on the other (all)."""
    from deltalake import DeltaTable

    writes = [c for c in DeltaTable(path).history() if c.get("operation") in ("MERGE", "UPDATE")]
    by_delta_rs = [str(c.get("clientVersion", "")).startswith("delta-rs") for c in writes]
    assert writes and (any(by_delta_rs) if history_path == "driver" else not any(by_delta_rs)), writes


def test_no_version_starts_before_the_one_it_follows(spark: Any, tmp_path: Path, history_path: str) -> None:
    """A generation taken while the table changes corrects history at the snapshot's time.
    An event the snapshot already held, committed just before it but delivered by Kafka
    after the generation's watermark, then closed that correction earlier than it opened:
    the version before it stayed valid until the snapshot, the event's from its commit,
    two versions of one key valid at once for an as-of query (the history test's stream
    found it: 2 misdated of ~2 000 versions). Each key's times now never go back: a version
    starts at the latest of its event's time and its key's last time in history."""
    from pyspark.sql import functions as F

    from cdc_platform.lake.history import ensure_history_table, snapshot_events
    from cdc_platform_tests.spark.synthetic import StreamedTable

    table = StreamedTable(spark, tmp_path, rows=[])
    path, keys, columns = table.table.history_path, ["id"], ["id", "v"]
    t0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)

    def at(seconds: int, *events: tuple[str, int, int, int]) -> Any:
        return table.events(list(events)).withColumn("source_ts", F.lit(t0 + timedelta(seconds=seconds)))

    ensure_history_table(spark, path, spark.createDataFrame([], "id long, v long").schema)
    apply_batch(spark, history_path, table.table, at(0, ("c", 1, 1, 100)), keys, columns)
    snapshot = spark.createDataFrame([(1, 2)], "id long, v long")  # the snapshot saw the update below
    correction = snapshot_events(spark, path, snapshot, keys, 50, (t0 + timedelta(seconds=60)).isoformat())
    apply_history(spark, path, correction, keys, columns, truncates=False)  # a generation's: Spark's always
    # committed before it, delivered after
    apply_batch(spark, history_path, table.table, at(30, ("u", 1, 2, 200)), keys, columns)
    # a truncate, then c
    apply_batch(spark, history_path, table.table, at(40, ("t", 0, 0, 300), ("c", 1, 3, 400)), keys, columns)
    assert_written_by(path, history_path)
    chain = history_chain(spark, table.table, keys)
    assert chain.versions == 4 and chain.faults == 0, chain
    versions = [
        (r["v"], r["_cdc_op"], r["valid_from"], r["valid_to"])
        for r in spark.read.format("delta").load(path).orderBy("_cdc_commit_lsn", "_cdc_lsn").collect()
    ]
    t60 = (t0 + timedelta(seconds=60)).replace(tzinfo=None)
    assert versions == [
        (1, "c", t0.replace(tzinfo=None), t60),
        (2, "r", t60, t60),  # the correction: its event came with an earlier time, and follows it
        (2, "u", t60, t60),  # closed by the truncate at 40 s, after it started
        (3, "c", t60, None),
    ]


def test_history_apply_leaves_no_batch_held_in_memory(spark: Any, tmp_path: Path) -> None:
    """Each batch's sequence is materialized once (a local checkpoint, so the MERGE plans
    no lineage); a long-running apply does so for every batch of a table with history, so
    its blocks are freed when the batch is done, not whenever the driver's GC gets to them."""
    from cdc_platform.lake.history import ensure_history_table
    from cdc_platform_tests.spark.synthetic import StreamedTable

    table = StreamedTable(spark, tmp_path, rows=[])
    path, keys, columns = table.table.history_path, ["id"], ["id", "v"]
    ensure_history_table(spark, path, spark.createDataFrame([], "id long, v long").schema)

    def held() -> set[int]:
        return {int(info.id()) for info in spark.sparkContext._jsc.sc().getRDDStorageInfo()}

    before = held()
    for n in range(3):
        result = apply_history(
            spark, path, table.events([("c", 10 + n, n, 100 + n), ("u", 1, n, 200 + n)]), keys, columns
        )
        assert result.versions_opened == 2, result
    assert held() <= before
    assert spark.read.format("delta").load(path).where("is_current").count() == 4  # keys 1, 10, 11, 12


def test_history_follows_the_source_through_any_redelivery_and_any_batching(
    spark: Any, tmp_path: Path, history_path: str
) -> None:
    """Model-based, as current's (``spark/test_current.py``): a random history delivered at
    least once, re-sent from earlier points and cut into batches anywhere. After every batch
    history holds one version per change delivered so far, opened and closed at the right
    positions, TOASTed values kept from the version before; no re-sent event adds, reopens
    or closes a version, and the chain has no overlap or gap."""
    from cdc_platform.lake.history import ensure_history_table
    from cdc_platform_tests.cases.redelivery import (
        batch_events,
        delivered,
        source_history,
        stale_resends,
        versions_after,
    )
    from cdc_platform_tests.spark.synthetic import StreamedTable

    # seed and length: every case under test occurs in 11 batches (a batch is a merge; this
    # test ran 27 batches before, CI's budget is minutes)
    rng = random.Random(5)
    table = StreamedTable(spark, tmp_path, rows=[])
    path, keys, columns = table.table.history_path, ["id"], ["id", "v"]
    ensure_history_table(spark, path, spark.createDataFrame([], "id long, v long").schema)
    history = source_history(rng, {}, changes=40)
    batches = delivered(rng, history)
    assert stale_resends(history, batches) >= {"c", "u", "d", "after t"}
    newest = 0
    for batch in batches:
        events, toasted = batch_events(history, batch)
        apply_batch(spark, history_path, table.table, table.events(events, toasted), keys, columns)
        newest = max(newest, *(i + 1 for i in batch))
        rows = spark.read.format("delta").load(path).collect()
        versions = sorted(
            ((r["id"], r["v"], r["_cdc_op"], r["_cdc_commit_lsn"], r["_cdc_end_commit_lsn"]) for r in rows),
            key=lambda version: (version[0], version[3]),
        )
        assert versions == versions_after(history, newest), (batch, newest)
        assert all(r["is_current"] == (r["_cdc_end_commit_lsn"] is None) for r in rows)
    chain = history_chain(spark, table.table, keys)
    assert chain.faults == 0 and chain.versions == len(versions_after(history, len(history))), chain
    assert_written_by(path, history_path)
