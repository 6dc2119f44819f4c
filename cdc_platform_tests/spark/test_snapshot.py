"""Snapshot generations on the real stack: exact types, parallel and consistent."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
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
from cdc_platform.lake.crash_points import ENV as CRASH_ENV
from cdc_platform.model.errors import GenerationRejectedError, SourceTableError
from cdc_platform_tests.cases.pg_types import TYPE_CASES, type_cases_ddl
from cdc_platform_tests.chunked import when_half_written
from cdc_platform_tests.integration.capture_env import CaptureEnv, make_capture_env

pytestmark = pytest.mark.integration


@pytest.fixture
def env(demo_db: Any, tmp_path: Path) -> Iterator[CaptureEnv]:
    ddl = [
        *type_cases_ddl(),
        "CREATE TABLE events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), n int NOT NULL)",
        "CREATE TABLE counters (id bigint PRIMARY KEY, n int NOT NULL)",
        "CREATE TABLE tenant_rows (tenant text, n int, PRIMARY KEY (tenant, n))",
        "CREATE TABLE keyless (code text, n int)",  # no key: a configured one, REPLICA IDENTITY FULL
        "ALTER TABLE keyless REPLICA IDENTITY FULL",
        "CREATE TABLE pairs (region text, code text, n int)",  # a configured composite key that may hold NULL
        "ALTER TABLE pairs REPLICA IDENTITY FULL",
        # keys the read converts (numeric to text, an enum to text, an instant to micros)
        "CREATE TABLE amounts (id numeric PRIMARY KEY, n int NOT NULL)",
        "CREATE TABLE moods (mood cap_mood, n int, PRIMARY KEY (mood, n))",
        "CREATE TABLE instants (at timestamptz PRIMARY KEY, n int NOT NULL)",
        # legacy inheritance: the child's rows are read with the parent's, its keys not under the parent's index
        "CREATE TABLE inherited (id bigint PRIMARY KEY, n int NOT NULL)",
        "CREATE TABLE inherited_child () INHERITS (inherited)",
        # a key two values of which the lake writes alike (a time with its zone, as UTC text)
        "CREATE TABLE clock_keys (at timetz PRIMARY KEY, n int NOT NULL)",
        # a nearly unique wide text (19 of 20 rows distinct) and a low-cardinality one
        "CREATE TABLE spreads (id bigint PRIMARY KEY, pair text NOT NULL, tenant text NOT NULL)",
    ]
    tables = [
        "type_cases", "events", "counters", "tenant_rows", "keyless", "pairs", "amounts", "moods", "instants",
        "inherited", "clock_keys", "spreads",
    ]  # fmt: skip
    yield from make_capture_env(demo_db, tmp_path, ddl, tables)


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
    for table in ("events", "counters"):  # one exported snapshot for every chunk; several chunks
        env.configure_table(table, "snapshot: {mode: exported, chunk_rows: 500}")
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
    assert uuid_result.rows == uuid_result.source_rows >= 3000  # the key chunks cover every row once
    counters = spark.read.format("delta").load(counters_result.path)
    # one transaction updates every row: a consistent snapshot sees one value across all partitions
    assert counters.select("n").distinct().count() == 1
    assert counters.count() == 3000
    assert counters_result.watermark.position > 0
    assert set(uuid_result.watermark.kafka_end_offsets) <= {0, 1, 2}
    # a generation is read whole, never pruned: file statistics on its key alone
    assert _statistics_columns(spark, uuid_result.path) == _statistics_columns(spark, counters_result.path) == "`id`"


def test_chunks_cover_every_row_once_and_stay_even_for_any_key(env: CaptureEnv, spark: Any) -> None:
    """Key-range chunks of a uuid key, a composite key with one tenant holding 90 % of the
    rows, an integer key with a few huge outliers (equal value ranges would put nearly every
    row in one chunk), and a configured key on a table without one: each row in exactly one
    chunk, every chunk within 2x of the median, and no transaction open once planned. A
    composite configured key with NULLs: those rows in the NULL chunk only (a row comparison
    such as ('r1', NULL) <= ('r2', 'c5') is true, so they were read twice)."""
    with env.app() as app:
        app.execute("INSERT INTO events (n) SELECT g FROM generate_series(1, 3000) g")
        app.execute(
            "INSERT INTO tenant_rows SELECT CASE WHEN g % 10 = 0 THEN 't' || g ELSE 'big' END, g "
            "FROM generate_series(1, 3000) g"
        )
        app.execute(
            "INSERT INTO counters SELECT CASE WHEN g <= 2990 THEN g ELSE g * 1000000000000 END, 0 "
            "FROM generate_series(1, 3000) g"
        )
        app.execute("INSERT INTO keyless SELECT 'c' || g, g FROM generate_series(1, 3000) g")
        app.execute(  # 1 % of the rows with a NULL in the key's second column
            "INSERT INTO pairs SELECT 'r' || g % 50, CASE WHEN g % 100 = 0 THEN NULL ELSE 'c' || g END, g "
            "FROM generate_series(1, 3000) g"
        )
    tables = ("events", "tenant_rows", "counters", "keyless", "pairs")
    for name in tables:
        env.configure_table(name, "snapshot: {chunk_rows: 400}")
    env.configure_table("keyless", "primary_key: [code]")
    env.configure_table("pairs", "primary_key: [region, code]")
    lake = Lake(env.config, spark)
    for name in tables:
        lake_table = lake.table(f"cap.{env.schema}.{name}")
        source = lake.source(lake_table.key)
        with source.snapshot(lake_table.config, lake.kafka, lake_table.topic, consistent=False) as plan:
            predicates = plan.read.predicates
            with env.app() as app, env.admin() as admin:
                held = _transactions_holding_a_snapshot(admin, env.schema)
                sizes = [_count(app, f"SELECT count(*) FROM {name} WHERE {p}") for p in predicates]
                uncovered = _count(app, f"SELECT count(*) FROM {name} WHERE NOT ({' OR '.join(predicates)})")
        assert held == 0, name  # incremental: the plan's transaction ended before the read
        assert (sum(sizes), uncovered) == (3000, 0), name  # covered, and no row in two chunks
        ranges = sizes[:-1] if name in ("keyless", "pairs") else sizes  # a nullable key adds a chunk for NULL keys
        median = statistics.median(ranges)
        assert len(ranges) == 8 and max(ranges) <= 2 * median and min(ranges) * 2 >= median, (name, sizes)


def test_a_wrong_row_estimate_changes_how_many_chunks_never_their_size(env: CaptureEnv) -> None:
    """An incremental plan walks the key in steps sized from ``pg_class``'s estimate, which
    a busy table outgrows between two ANALYZEs: with an estimate a third of the truth or
    thirty times it, every row is still in exactly one chunk, no chunk is above
    ``chunk_rows`` but the last (a short remainder joins it: at most 1.5 steps), and the
    rows walked are the table's."""
    from cdc_platform.sources.postgres.chunks import walk_chunks

    with env.app() as app:
        app.execute("INSERT INTO tenant_rows SELECT 't' || (g % 7), g FROM generate_series(1, 3000) g")
        for estimate, chunks in ((1000, 9), (90_000, 8), (0, 8)):  # 0: never analyzed, counted
            rows, predicates = walk_chunks(app, env.schema, "tenant_rows", ("tenant", "n"), False, estimate, 400)
            sizes = [_count(app, f"SELECT count(*) FROM tenant_rows WHERE {p}") for p in predicates]
            uncovered = _count(app, f"SELECT count(*) FROM tenant_rows WHERE NOT ({' OR '.join(predicates)})")
            assert (rows, sum(sizes), uncovered, len(sizes)) == (3000, 3000, 0, chunks), (estimate, sizes)
            assert max(sizes[:-1]) <= 400 and sizes[-1] <= 600, (estimate, sizes)


def test_a_key_holding_null_rejects_the_generation_saying_so(env: CaptureEnv, spark: Any) -> None:
    """The blocking keys check fails on a NULL key, so a generation with one is rejected,
    naming the NULL and the fix. Before: it was rejected as "not unique" (Spark's distinct
    count leaves NULLs out), for a key that was unique."""
    with env.app() as app:
        app.execute("INSERT INTO pairs SELECT 'r' || g % 7, CASE WHEN g = 5 THEN NULL ELSE 'c' || g END, g "
                    "FROM generate_series(1, 300) g")  # fmt: skip
    env.configure_table("pairs", "primary_key: [region, code]")
    env.configure_table("pairs", "snapshot: {chunk_rows: 100}")
    with pytest.raises(GenerationRejectedError) as rejected:
        Lake(env.config, spark).snapshot(f"cap.{env.schema}.pairs", "g1")
    message = str(rejected.value)
    assert "1 row(s) with a NULL in the key (region, code)" in message, message
    assert "not unique" not in message and "primary_key" in message, message


def test_chunks_of_keys_the_read_converts_hold_every_row_once(env: CaptureEnv, spark: Any) -> None:
    """A key whose lake form is not its source form (numeric read as text, an enum as text,
    timestamptz as microseconds): the chunk ranges are the source's order, so the read
    must apply them to the source's columns. Before: they were applied to the converted
    columns, so a numeric key compared as text and rows were silently left out (or read
    twice), and a timestamptz key failed the read."""
    with env.app() as app:
        app.execute("INSERT INTO amounts SELECT g * 7.5, g FROM generate_series(1, 1200) g")
        app.execute(
            "INSERT INTO moods SELECT (ARRAY['happy', 'so-so', 'sad'])[1 + g % 3]::cap_mood, g "
            "FROM generate_series(1, 1200) g"
        )
        app.execute("INSERT INTO instants SELECT TIMESTAMPTZ '2020-01-01' + g * INTERVAL '7 hours', g "
                    "FROM generate_series(1, 1200) g")  # fmt: skip
    for name in ("amounts", "moods", "instants"):
        env.configure_table(name, "snapshot: {chunk_rows: 100}")
    lake = Lake(env.config, spark)
    for name in ("amounts", "moods", "instants"):
        result = lake.snapshot(f"cap.{env.schema}.{name}", "g1")
        assert result.spark_partitions >= 12, name
        written = spark.read.format("delta").load(result.path)
        assert sorted(r["n"] for r in written.select("n").collect()) == list(range(1, 1201)), name
    assert _statistics_columns(spark, result.path) == "`at`"  # chunked waves: the key's statistics alone


def test_a_generations_files_show_its_keys_unique_and_a_key_they_cannot_is_counted(env: CaptureEnv, spark: Any) -> None:
    """Validation shows each key once from a chunked generation's files (one file per
    chunk, a key range: ``lake/key_proof.py``) for a bigint, a uuid and a composite text
    key; a numeric key read as text (chunks are ranges of numbers, not of their text)
    gives ranges that overlap, so validation counts the keys instead, and the generation
    still commits. The tables' primary keys vouch for each chunk's keys, so the Delta log's
    statistics alone show the bigint and uuid keys unique (the composite key's first
    column, split between chunks, and the numeric key's text do not); a configured key
    that is no primary key vouches for nothing."""
    from cdc_platform.lake.key_proof import proven_unique, slice_summaries, statistics_summaries

    with env.app() as app:
        app.execute("INSERT INTO counters SELECT g, g FROM generate_series(1, 3000) g")
        app.execute("INSERT INTO events (n) SELECT g FROM generate_series(1, 3000) g")
        app.execute("INSERT INTO tenant_rows SELECT 't' || g % 7, g FROM generate_series(1, 3000) g")
        app.execute("INSERT INTO amounts SELECT g * 7.5, g FROM generate_series(1, 3000) g")
    tables = {"counters": ("id",), "events": ("id",), "tenant_rows": ("tenant", "n"), "amounts": ("id",)}
    for name in tables:
        env.configure_table(name, "snapshot: {chunk_rows: 400}")
    lake = Lake(env.config, spark)
    for name, key in tables.items():
        result = lake.snapshot(f"cap.{env.schema}.{name}", "g1")
        assert result.rows == 3000 and result.spark_partitions == 8, name
        slices = slice_summaries(spark.read.format("delta").load(result.path), key)
        assert slices is not None and sum(s.rows for s in slices) == 3000, name
        assert proven_unique(slices) is (name != "amounts"), (name, slices)
        files = statistics_summaries(result.path, key)
        assert files is not None and proven_unique(files) is (name in ("counters", "events")), (name, files)
    env.configure_table("keyless", "primary_key: [code]")
    lake = Lake(env.config, spark)
    for name, vouched in (("counters", True), ("keyless", False), ("inherited", False)):
        table = lake.table(f"cap.{env.schema}.{name}")
        with lake.source(table.key).snapshot(table.config, lake.kafka, table.topic, False) as plan:
            assert plan.key_unique_per_chunk is vouched, name


def test_nearly_unique_columns_are_written_without_a_parquet_dictionary(env: CaptureEnv, spark: Any) -> None:
    """Parquet's writer builds a dictionary of each column and drops it where it saves
    nothing, which for a nearly unique column is most values hashed for nothing. A
    generation writes the columns the source holds nearly unique (the one-column primary
    key, and after ANALYZE the columns estimated at nine in ten rows distinct or more)
    without one, and keeps it for the others. ``pair`` (19 of 20 rows distinct, 192
    characters, a value's repeats side by side) shows it: Parquet would keep a dictionary
    of it. The session's setting is as before afterwards and the rows are the source's."""
    import pyarrow.parquet as pq

    from cdc_platform.lake.tables import DICTIONARY_SETTING

    with env.app() as app:
        app.execute(
            "INSERT INTO spreads SELECT g, repeat(md5((g * 19 / 20)::text), 6), 't' || g % 7 "
            "FROM generate_series(1, 3000) g"
        )
        app.execute("ANALYZE spreads")
    env.configure_table("spreads", "snapshot: {chunk_rows: 400}")
    key = f"cap.{env.schema}.spreads"
    lake = Lake(env.config, spark)
    table = lake.table(key)
    with lake.source(key).snapshot(table.config, lake.kafka, table.topic, False) as plan:
        assert set(plan.distinct_columns) == {"id", "pair"}, plan.distinct_columns
    result = lake.snapshot(key, "g1")
    encodings: dict[str, set[str]] = {"pair": set(), "tenant": set()}
    for part in Path(result.path).glob("*.parquet"):
        row_groups = pq.ParquetFile(part).metadata
        for group in range(row_groups.num_row_groups):
            for column in range(row_groups.num_columns):
                chunk = row_groups.row_group(group).column(column)
                encodings.get(chunk.path_in_schema, set()).update(chunk.encodings)
    assert encodings["tenant"] and any("DICTIONARY" in e for e in encodings["tenant"]), encodings
    assert encodings["pair"] and not any("DICTIONARY" in e for e in encodings["pair"]), encodings
    assert spark.conf.get(DICTIONARY_SETTING.format("pair"), None) is None
    snapshot = spark.read.format("delta").load(result.path)
    truth = lake.truth(key)
    assert result.rows == 3000 and (snapshot.exceptAll(truth).count(), truth.exceptAll(snapshot).count()) == (0, 0)


def test_a_key_in_a_parent_and_its_inheriting_table_rejects_the_generation(env: CaptureEnv, spark: Any) -> None:
    """The parent's primary key does not cover a legacy inheritance child, whose rows the
    snapshot reads with the parent's: the same key in both is a duplicate in one chunk, and
    validation reads the rows to find it (the log's statistics would not show it)."""
    with env.app() as app:
        app.execute("INSERT INTO inherited SELECT g, g FROM generate_series(1, 50) g")
        app.execute("INSERT INTO inherited_child VALUES (7, 0)")
    with pytest.raises(GenerationRejectedError, match="holds 51 rows but 50 distinct keys"):
        Lake(env.config, spark).snapshot(f"cap.{env.schema}.inherited", "g1")


def test_a_key_the_lake_writes_alike_is_refused_by_snapshot_and_capture(env: CaptureEnv, spark: Any) -> None:
    """'12:00+01' and '11:00+00' are two keys to a timetz primary key and one to the lake
    (the UTC time as text). A generation holding both was rejected, but one made before
    the second arrived committed, and the changelog then merged the two rows into one
    current row: no check compared anything but lake keys. The key is refused now where
    the table is described, naming the column and the fix."""
    with env.app() as app:
        app.execute("INSERT INTO clock_keys VALUES ('12:00+01', 1), ('09:00+00', 3)")
    refused = "clock_keys cannot be keyed on at: .*'12:00\\+01' and '11:00\\+00'.* a primary key without them"
    with pytest.raises(SourceTableError, match=refused):
        Lake(env.config, spark).snapshot(f"cap.{env.schema}.clock_keys", "g1")
    config = env.config_path.read_text()  # capture of this table alone (the others' keys are configured elsewhere)
    env.config_path.write_text(
        config[: config.index("tables:\n")] + f"tables:\n  - name: cap.{env.schema}.clock_keys\n"
    )
    with pytest.raises(SourceTableError, match=refused):
        env.run_until_caught_up()


def _statistics_columns(spark: Any, path: str) -> str | None:
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().first()
    assert detail is not None
    return (detail["properties"] or {}).get("delta.dataSkippingStatsColumns")


def _count(app: Any, query: str) -> int:
    row = app.execute(query.encode()).fetchone()
    return int(row[0])


# the platform's backends on a schema's tables that hold an xmin horizon (%s: '%<schema>%')
HOLDING_XMIN = (
    "FROM pg_stat_activity WHERE application_name LIKE 'cdc_platform%%' AND backend_xmin IS NOT NULL "
    "AND query LIKE %s AND pid <> pg_backend_pid()"
)


def _transactions_holding_a_snapshot(app: Any, schema: str) -> int:
    """The platform's backends on this test's tables that hold an xmin horizon."""
    row = app.execute(
        f"SELECT count(*) {HOLDING_XMIN}",
        (f"%{schema}%",),
    ).fetchone()
    return int(row[0])


class XminWatch(threading.Thread):
    """Samples, every 10 ms, the transactions of the platform's backends on the test's
    schema that hold an xmin horizon: for each (pid, xact_start), when it was last seen,
    on the database's clock."""

    def __init__(self, env: CaptureEnv) -> None:
        super().__init__(daemon=True)
        self.env = env
        self.last_seen: dict[tuple[int, datetime], datetime] = {}
        self.slot_xmins: set[Any] = set()
        self._halt = threading.Event()

    def run(self) -> None:
        with self.env.admin() as admin:  # other roles' backends show their xmin to a superuser only
            while not self._halt.is_set():
                rows = admin.execute(
                    f"SELECT pid, xact_start, clock_timestamp() {HOLDING_XMIN}",
                    (f"%{self.env.schema}%",),
                ).fetchall()
                self.last_seen.update({(int(r[0]), r[1]): r[2] for r in rows})
                slot = admin.execute("SELECT xmin FROM pg_replication_slots WHERE slot_name = %s", (self.env.slot,))
                self.slot_xmins |= {r[0] for r in slot.fetchall()}
                time.sleep(0.01)

    def __enter__(self) -> XminWatch:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._halt.set()
        self.join()

    def longest_s(self) -> float:
        """How long the longest transaction seen had been open when last seen."""
        return max(((seen - started).total_seconds() for (_, started), seen in self.last_seen.items()), default=0.0)


def _db_now(env: CaptureEnv) -> datetime:
    with env.admin() as admin:
        row = admin.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["incremental", "exported"])
def test_an_incremental_generation_holds_no_snapshot_for_longer_than_a_chunk(
    env: CaptureEnv, spark: Any, mode: str
) -> None:
    """``pg_stat_activity.backend_xmin`` while a generation of 100k rows in 50 chunks is
    taken: incremental, no transaction of the platform stays open for a quarter of the
    generation (the plan's and each chunk's are short); exported (the proof that the watch
    sees a long transaction when there is one), the coordinator's spans most of it. The
    logical slot holds no xmin in either."""
    with env.app() as app:
        app.execute("INSERT INTO counters SELECT g, g FROM generate_series(1, 100000) g")
    env.configure_table("counters", f"snapshot: {{mode: {mode}, chunk_rows: 2000}}")
    lake = Lake(env.config, spark)
    key = f"cap.{env.schema}.counters"
    started = _db_now(env)
    with XminWatch(env) as watch:
        result = lake.snapshot(key, "g1")
    took = (_db_now(env) - started).total_seconds()
    assert result.rows == result.source_rows == 100_000 and result.spark_partitions == 50
    if mode == "incremental":
        assert watch.longest_s() < took / 4, (watch.longest_s(), took)
    else:
        assert watch.longest_s() > took / 2, (watch.longest_s(), took)
    assert watch.slot_xmins <= {None}


@pytest.mark.long_running
def test_a_killed_incremental_generation_resumes_without_reading_its_chunks_again(
    env: CaptureEnv, spark: Any, tmp_path: Path
) -> None:
    """``cdc-platform snapshot`` cut right after its first wave's commit (before the ledger
    records it), then ``--resume`` SIGKILLed once half of the chunks are recorded, then
    ``--resume`` again: each wave of the plan is committed exactly once (no run read a
    recorded wave again, and the unrecorded first wave was skipped by Delta as a commit it
    already holds), the generation commits under its own name with the source's rows."""
    with env.app() as app:
        app.execute("INSERT INTO counters SELECT g, g FROM generate_series(1, 60000) g")
    env.configure_table("counters", "snapshot: {chunk_rows: 1000, chunks_per_wave: 8}")
    key = f"cap.{env.schema}.counters"
    lake = Lake(env.config, spark)
    (tmp_path / "home").mkdir()
    cli = [str(Path(sys.executable).parent / "cdc-platform"), "--config", str(env.config_path), "snapshot", key]
    run_env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}

    cut = subprocess.run(
        cli, env={**run_env, CRASH_ENV: "snapshot.wave_written"}, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert cut.returncode == 137, cut.stdout[-2000:] + cut.stderr[-3000:]
    [generation] = lake.ledger.generations(key)
    path = lake.table(key).snapshot_path(generation)
    assert lake.ledger.chunk_progress(key, generation).written == set() and lake.wave_commits(key, generation) == [0]

    with (tmp_path / "killed.log").open("w") as log_file:
        killed = subprocess.Popen(
            [*cli, "--resume"], env=run_env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            plan, written = when_half_written(lake, key, generation, killed)
        finally:
            os.killpg(killed.pid, signal.SIGKILL)
            killed.wait()
    before = lake.wave_commits(key, generation)
    assert plan.waves_left(written) and len(before) < len(plan.waves())
    assert lake.ledger.committed(key) is None  # the killed generation did not commit

    resumed = subprocess.run([*cli, "--resume"], env=run_env, capture_output=True, text=True, timeout=600, check=False)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"{key}: generation {generation}: 60000 rows" in resumed.stdout
    after = lake.wave_commits(key, generation)
    assert sorted(after) == [n for n, _ in plan.waves()]  # every wave once: none read twice
    assert after[: len(before)] == before  # the earlier runs' commits stand; the last run added the rest
    committed = lake.ledger.committed(key)
    assert committed is not None and committed.generation == generation and committed.rows == 60_000
    snapshot, truth = spark.read.format("delta").load(path), lake.truth(key)
    assert (snapshot.exceptAll(truth).count(), truth.exceptAll(snapshot).count()) == (0, 0)


class Interrupted(Exception):
    """Stands in for a run killed between two waves."""


def test_a_snapshot_table_changed_between_runs_is_not_resumed_into_a_generation(env: CaptureEnv, spark: Any) -> None:
    """A generation interrupted after its first wave, its snapshot table then changed (rows
    deleted by hand, or by a tool): the ledger still records the first wave's chunks as
    written, but the table no longer holds them. Resuming must not commit a
    generation without those rows (validation cannot count the rows of chunks read at
    different instants): it is rejected, naming what changed the table. Before: the
    waves' commits were still in the table's history, so the check passed and the
    generation committed without the first wave's rows."""
    from delta.tables import DeltaTable

    from cdc_platform.lake.snapshot import GenerationRequest, take_generation
    from cdc_platform.model.errors import CdcError, GenerationRejectedError

    with env.app() as app:
        app.execute("INSERT INTO counters SELECT g, g FROM generate_series(1, 6000) g")
    env.configure_table("counters", "snapshot: {chunk_rows: 300, chunks_per_wave: 8}")  # 20 chunks, 3 waves
    key = f"cap.{env.schema}.counters"
    lake = Lake(env.config, spark)
    table, request = lake.table(key), GenerationRequest("g1")

    def interrupt_after_a_wave(line: str) -> None:
        if " chunks" in line and "ETA" in line:
            raise Interrupted(line)

    def generation(progress: Any) -> Any:
        return take_generation(spark, lake.ledger, lake.source(key), lake.kafka, table, request, progress)

    with pytest.raises(CdcError):
        generation(interrupt_after_a_wave)
    path = table.snapshot_path("g1")
    assert lake.ledger.chunk_progress(key, "g1").written and lake.wave_commits(key, "g1") == [0]
    DeltaTable.forPath(spark, path).delete("n % 2 = 0")
    with pytest.raises(GenerationRejectedError, match="DELETE"):
        generation(lambda _line: None)
    assert lake.ledger.committed(key) is None
