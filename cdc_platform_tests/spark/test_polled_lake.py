"""A polled (MariaDB) table through the same lake assets: Spark JDBC snapshot with the
type mapping, changelog + current from polled events, hard deletes reported by
completeness and dropped by a reconciliation generation."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.devtools.lake import Lake
from cdc_platform.devtools.stack import StackProfile
from cdc_platform.lake.verify import VerifyContext, verify_table
from cdc_platform.sources import open_source
from cdc_platform.sources.mysql.connection import CLOCK_SQL
from cdc_platform.sources.mysql.poller import CAUGHT_UP_EVERY_NS
from cdc_platform.sources.mysql.source import MysqlConnector
from cdc_platform_tests.cases.mysql_types import MYSQL_EDGE_CASES, MYSQL_TYPE_CASES, type_cases_ddl
from cdc_platform_tests.integration.polling_env import PollingEnv, make_polling_env

ACCOUNTS_DDL = """CREATE TABLE accounts (
  id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY,
  email VARCHAR(80) NOT NULL,
  balance DECIMAL(12,2) NOT NULL,
  active TINYINT(1) NOT NULL DEFAULT 1,
  deleted_at DATETIME(6) NULL,
  updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
)"""
POLL = "{mode: timestamp+incrementing, timestamp_column: updated_at, incrementing_column: id"


@pytest.fixture
def env(stack: StackProfile, tmp_path: Path) -> Iterator[PollingEnv]:
    yield from make_polling_env(stack, tmp_path, [ACCOUNTS_DDL, type_cases_ddl()])


def _window(env: PollingEnv, lake: Lake, key: str, start: datetime) -> datetime:
    env.poll()
    time.sleep(1.1)
    end = datetime.now(UTC).replace(microsecond=0)
    lake.window(key, start, end)
    return end


def _lake(lake: Lake, key: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r.asDict() for r in lake.read_current(key).collect()}


def _source(env: PollingEnv, where: str = "deleted_at IS NULL") -> dict[int, tuple[str, str, bool]]:
    with env.db() as db:
        db.execute(f"SELECT id, email, CAST(balance AS CHAR), active FROM accounts WHERE {where}")
        return {int(r[0]): (str(r[1]), str(r[2]), bool(r[3])) for r in db.fetchall()}


def _as_source(rows: dict[int, dict[str, Any]]) -> dict[int, tuple[str, str, bool]]:
    return {k: (r["email"], str(r["balance"]), r["active"]) for k, r in rows.items()}


@pytest.mark.spark_codegen
def test_every_mariadb_type_lands_the_same_through_snapshot_and_polling(env: PollingEnv, spark: Any) -> None:
    env.write_config(f"  - name: crm.{env.database}.type_cases\n    poll: {POLL}}}\n    changelog: {{grace_s: 0}}\n")
    lake = Lake(env.config, spark)
    key = f"crm.{env.database}.type_cases"
    lake.snapshot(key, "g1")  # empty: every row arrives through polling
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    # one row per type, then one row per edge case (each sets one column)
    cases = [(name, name, literal, value) for name, _, literal, value, _ in MYSQL_TYPE_CASES] + MYSQL_EDGE_CASES
    with env.db() as db:
        for case, column, literal, _ in cases:
            db.execute(f"INSERT INTO type_cases (case_name, {column}) VALUES ('{case}', {literal})")
    _window(env, lake, key, start)
    applied = lake.current(key)
    assert applied.changes_applied == len(cases)
    expected = {case: value for case, _, _, value in cases}
    column_of = {case: column for case, column, _, _ in cases}
    current = lake.read_current(key)
    assert {r["case_name"]: r[column_of[r["case_name"]]] for r in current.collect()} == expected
    # and through a Spark JDBC snapshot: the same types, the same values, the same rows
    snapshot = spark.read.format("delta").load(lake.snapshot(key, "g2").path)
    lake_types = {f.name: f.dataType.simpleString() for f in snapshot.schema.fields}
    assert {name: lake_types[name] for name, *_ in MYSQL_TYPE_CASES} == {n: t for n, *_, t in MYSQL_TYPE_CASES}
    assert {r["case_name"]: r[column_of[r["case_name"]]] for r in snapshot.collect()} == expected
    assert snapshot.schema == current.schema
    assert (snapshot.exceptAll(current).count(), current.exceptAll(snapshot).count()) == (0, 0)
    unsigned_max = snapshot.where("case_name = 'c_bigint_u'").first()
    assert unsigned_max is not None and unsigned_max["c_bigint_u"] == 18446744073709551615  # no overflow


def test_hard_deletes_are_reported_and_a_reconciliation_generation_drops_them(env: PollingEnv, spark: Any) -> None:
    env.write_config(
        f"  - name: crm.{env.database}.accounts\n    poll: {POLL}, soft_delete_column: deleted_at, "
        "reconcile_every: 6h}\n    changelog: {grace_s: 0}\n"
    )
    lake = Lake(env.config, spark)
    key = f"crm.{env.database}.accounts"
    with env.db() as db:
        db.executemany(
            "INSERT INTO accounts (email, balance) VALUES (%s, %s)", [(f"a{i}@x.io", f"{i}.50") for i in range(40)]
        )
    env.poll()
    lake.snapshot(key, "g1")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.db() as db:
        db.execute("UPDATE accounts SET balance = balance + 100 WHERE id % 5 = 0")
        db.execute("UPDATE accounts SET active = 0 WHERE id IN (2, 3)")
        db.executemany(
            "INSERT INTO accounts (email, balance) VALUES (%s, %s)", [(f"n{i}@x.io", "1.00") for i in range(5)]
        )
        db.execute("UPDATE accounts SET deleted_at = NOW(6) WHERE id IN (6, 7, 8)")  # soft deletes: seen
        db.execute("DELETE FROM accounts WHERE id IN (11, 12, 13, 41)")  # hard deletes: invisible to polling
    start = _window(env, lake, key, start)
    first = lake.current(key)
    assert first.dropped_by_generation is None  # the first build has no earlier current to compare
    current = _lake(lake, key)
    live = _source(env)
    hard_deleted = {11, 12, 13}  # 41 came and went between two polls: never seen at all
    assert _as_source(current) == live | {k: _as_source(current)[k] for k in hard_deleted}
    assert not {6, 7, 8} & set(current)  # soft deletes became deletes
    assert hard_deleted <= set(current) and 41 not in current  # polling cannot see hard deletes: they linger
    report = lake.completeness(key)
    assert report.deleted_in_source == 3
    assert report.passed  # the changelog itself is complete; the lingering rows are a warning
    assert any('"id": 11' in s for s in report.sample)
    # the reconciliation generation: current rebuilds from it and equals the source
    lake.snapshot(key, "g2")
    rebuilt = lake.current(key)
    assert rebuilt.rebuilt and rebuilt.dropped_by_generation == 3
    assert _as_source(_lake(lake, key)) == _source(env)
    # changes after the new watermark still flow
    with env.db() as db:
        db.execute("UPDATE accounts SET balance = 7.77 WHERE id = 1")
        db.execute("UPDATE accounts SET deleted_at = NOW(6) WHERE id = 9")
    _window(env, lake, key, start)
    later = lake.current(key)
    assert later.changes_applied >= 2
    assert _as_source(_lake(lake, key)) == _source(env)
    assert lake.completeness(key).deleted_in_source == 0
    # verify waits for a poll that began after it, then compares row by row; a hard
    # delete shows as a row only current has
    with env.db() as db:
        db.execute("DELETE FROM accounts WHERE id = 14")
    with env.running_poller():
        ctx = VerifyContext(spark, lake.ledger, lake.source(key), lake.kafka)
        verdict = verify_table(ctx, lake.table(key), timeout_s=60, rounds=1)
    assert (verdict.note, verdict.missing, verdict.mismatches, verdict.extra) == ("", 0, 0, 1)
    assert verdict.sample == ['extra {"id": 14}']


def test_a_rejected_generation_is_never_used(env: PollingEnv, spark: Any) -> None:
    """Bug 5: a generation that fails its validation (a configured key that is not unique)
    is recorded as failed and current keeps using the last committed one."""
    from cdc_platform.model.errors import GenerationRejectedError, NoGenerationError
    from cdc_platform.model.generations import GenerationStatus

    with env.db() as db:
        db.execute("CREATE TABLE dup (id INT NOT NULL, v INT, ts DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))")
        db.execute("INSERT INTO dup (id, v) VALUES (1, 1), (2, 2)")
    poll = "    poll: {mode: timestamp, timestamp_column: ts}\n"
    env.write_config(f"  - name: crm.{env.database}.dup\n    primary_key: [id]\n{poll}")
    lake = Lake(env.config, spark)
    key = f"crm.{env.database}.dup"
    with env.db() as db:
        db.execute("INSERT INTO dup (id, v) VALUES (1, 9)")  # the key is not unique any more
    with pytest.raises(GenerationRejectedError, match="not unique in the source"):
        lake.snapshot(key, "g1")
    assert lake.ledger.generations(key)["g1"].status is GenerationStatus.FAILED
    with pytest.raises(NoGenerationError):
        lake.current(key)  # nothing committed: current is not built from the rejected generation
    with env.db() as db:
        db.execute("DELETE FROM dup WHERE v = 9")
    lake.snapshot(key, "g2")
    assert lake.current(key).generation == "g2"
    with env.db() as db:
        db.execute("INSERT INTO dup (id, v) VALUES (2, 9)")
    with pytest.raises(GenerationRejectedError):
        lake.snapshot(key, "g3")
    rebuilt = lake.current(key)
    assert rebuilt.generation == "g2" and not rebuilt.rebuilt  # the rejected g3 is never used
    assert sorted((r["id"], r["v"]) for r in lake.read_current(key).collect()) == [(1, 1), (2, 2)]


TS = "ts DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
CHUNKED_DDL = [
    f"CREATE TABLE tenants (tenant VARCHAR(20), n INT, {TS}, PRIMARY KEY (tenant, n))",
    f"CREATE TABLE big_ids (id BIGINT UNSIGNED PRIMARY KEY, n INT, {TS})",
    f"CREATE TABLE moods (mood ENUM('sad', 'happy', 'ok'), n INT, {TS}, PRIMARY KEY (mood, n))",
    f"CREATE TABLE blobs (id VARBINARY(16) PRIMARY KEY, n INT, {TS})",
]
CHUNKED_POLL = "    poll: {mode: timestamp, timestamp_column: ts}\n    snapshot: {chunk_rows: 100}\n"
CHUNKED_ROWS = {
    "tenants": "SELECT IF(seq % 10 = 0, CONCAT('t', seq), 'big'), seq",  # one tenant holds 90 % of the rows
    "big_ids": "SELECT IF(seq % 2 = 0, seq, 18446744073709551615 - seq), seq",  # past 2^63: read as text
    "moods": "SELECT ELT(1 + seq % 3, 'sad', 'happy', 'ok'), seq",  # enum order is not the labels' order
    "blobs": "SELECT UNHEX(MD5(seq)), seq",
}


def test_polled_tables_read_in_even_key_range_chunks_whatever_the_key(env: PollingEnv, spark: Any) -> None:
    """Key-range chunks of a skewed composite key, an unsigned bigint past 2^63 (read as
    text), an enum (its order is not its labels') and a binary key: every row read once
    through the generation, every chunk within 2x of the median, and no chunk's read
    examines the whole table (MariaDB scanned every row for a composite key's row
    comparison, once per chunk), but an ENUM key's (README: known limits)."""
    with env.db() as db:
        for ddl in CHUNKED_DDL:
            db.execute(ddl)
        for name, rows in CHUNKED_ROWS.items():
            db.execute(f"INSERT INTO {name} (`{'`, `'.join(_key_and_n(name))}`) {rows} FROM seq_1_to_1200")
    env.write_config("".join(f"  - name: crm.{env.database}.{name}\n{CHUNKED_POLL}" for name in CHUNKED_ROWS))
    lake = Lake(env.config, spark)
    for name in CHUNKED_ROWS:
        key = f"crm.{env.database}.{name}"
        result = lake.snapshot(key, "g1")
        written = spark.read.format("delta").load(result.path)
        assert sorted(r["n"] for r in written.select("n").collect()) == list(range(1, 1201)), name
        plan = lake.ledger.chunk_progress(key, "g1").plan
        assert plan is not None and len(plan.predicates) == 12, name
        with env.db() as db:
            sizes, examined = [], []
            for predicate in plan.predicates:
                db.execute(f"SELECT COUNT(*) FROM {name} WHERE {predicate}")
                sizes.append(int(db.fetchone()[0]))
                examined.append(_rows_examined(db, name, f"SELECT * FROM {name} WHERE {predicate}"))
        median = statistics.median(sizes)
        assert sum(sizes) == 1200 and max(sizes) <= 2 * median and min(sizes) * 2 >= median, (name, sizes)
        if name != "moods":  # an ENUM compares by index: MariaDB serves `mood = 2` from the index, not `mood < 2`
            assert max(examined) <= 4 * median, (name, examined)  # a range of the key's index, not 1200 rows


def _rows_examined(db: Any, table: str, query: str) -> int:
    """Rows MariaDB read from ``table`` to answer ``query`` (ANALYZE: it runs the query)."""
    db.execute(f"ANALYZE FORMAT=JSON {query}")
    found: list[float] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("table_name") == table and "r_rows" in node:
                found.append(float(node["r_rows"]) * float(node.get("r_loops", 1)))
            for child in node.values():
                visit(child)
        elif isinstance(node, list):
            for child in node:
                visit(child)

    visit(json.loads(db.fetchone()[0]))
    assert found, f"no access to {table} in the plan of {query}"
    return int(sum(found))


def _key_and_n(name: str) -> tuple[str, str]:
    return ("tenant" if name == "tenants" else "mood" if name == "moods" else "id", "n")


def test_an_interrupted_polled_generation_resumes_without_reading_its_chunks_again(env: PollingEnv, spark: Any) -> None:
    """A polled table's generation stops after its first wave (its run killed); run again
    under its name it reads only the waves not recorded, with the plan's watermark: each
    wave committed once, every row once."""
    from cdc_platform.lake.snapshot import GenerationRequest, take_generation
    from cdc_platform.model.errors import CdcError

    with env.db() as db:
        db.execute(CHUNKED_DDL[1])
        db.execute(f"INSERT INTO big_ids (id, n) {CHUNKED_ROWS['big_ids']} FROM seq_1_to_3000")
    key = f"crm.{env.database}.big_ids"
    env.write_config(
        f"  - name: {key}\n    poll: {{mode: timestamp, timestamp_column: ts}}\n"
        "    snapshot: {chunk_rows: 100, chunks_per_wave: 8}\n"
    )
    lake = Lake(env.config, spark)

    def killed_after_a_wave(line: str) -> None:
        if " chunks (" in line:
            raise RuntimeError("killed")

    def generation(progress: Any) -> Any:
        request = GenerationRequest("g1")
        return take_generation(spark, lake.ledger, lake.source(key), lake.kafka, lake.table(key), request, progress)

    with pytest.raises(CdcError):
        generation(killed_after_a_wave)
    first = lake.ledger.chunk_progress(key, "g1")
    assert first.plan is not None and 0 < len(first.written) < len(first.plan.predicates)
    assert lake.wave_commits(key, "g1") == [0]
    result = generation(lambda _line: None)
    assert lake.wave_commits(key, "g1") == [n for n, _ in first.plan.waves()]  # wave 0 not read again
    written = spark.read.format("delta").load(result.path)
    assert sorted(r["n"] for r in written.select("n").collect()) == list(range(1, 3001))
    assert lake.ledger.committed(key) is not None


VOUCHING_DDL = [
    f"CREATE TABLE ids (id INT UNSIGNED PRIMARY KEY, n INT, {TS})",
    f"CREATE TABLE by_n (id INT NOT NULL, n INT NOT NULL UNIQUE, {TS})",  # no primary key: one is configured
]


def test_a_polled_primary_key_vouches_for_its_chunks_and_the_log_shows_it_unique(env: PollingEnv, spark: Any) -> None:
    """Each chunk of a polled table is one statement under its primary key's unique index,
    so the plan vouches for the chunk's keys when every key column's lake value is the value
    MariaDB compares (integers, strings read as they are); the Delta log's statistics then
    show an integer key unique without reading a row. Nothing else vouches: a configured key
    (the table has none), an unsigned BIGINT read as text, an ENUM and a binary key."""
    from cdc_platform.lake.key_proof import proven_unique, statistics_summaries

    with env.db() as db:
        for ddl in [*VOUCHING_DDL, *CHUNKED_DDL]:
            db.execute(ddl)
        db.execute("INSERT INTO ids (id, n) SELECT seq * 3, seq FROM seq_1_to_1200")
        db.execute("INSERT INTO by_n (id, n) SELECT seq, seq FROM seq_1_to_10")
    names = ["ids", "by_n", *CHUNKED_ROWS]
    env.write_config(
        "".join(f"  - name: crm.{env.database}.{name}\n{CHUNKED_POLL}" for name in names if name != "by_n")
        + f"  - name: crm.{env.database}.by_n\n    primary_key: [n]\n{CHUNKED_POLL}"
    )
    lake = Lake(env.config, spark)
    vouches = {"ids": True, "tenants": True, "by_n": False, "big_ids": False, "moods": False, "blobs": False}
    for name, vouched in vouches.items():
        table = lake.table(f"crm.{env.database}.{name}")
        with lake.source(table.key).snapshot(table.config, lake.kafka, table.topic, False) as plan:
            assert plan.key_unique_per_chunk is vouched, name
    result = lake.snapshot(f"crm.{env.database}.ids", "g1")
    files = statistics_summaries(result.path, ("id",))
    assert result.rows == 1200 and files is not None and len(files) == 12 and proven_unique(files), files


def test_a_tinyint1_key_is_refused_by_snapshot_and_poller(env: PollingEnv, spark: Any) -> None:
    """A TINYINT(1) is read as a boolean, so keys 1 and 2 are both true to the lake: a
    generation holding both was rejected, but one made before the second arrived
    committed, and polling then merged the two rows into one current row. The key is
    refused now where the table is described, naming the column and the fix."""
    from cdc_platform.model.errors import SourceTableError

    with env.db() as db:
        db.execute(f"CREATE TABLE flags (flag TINYINT(1) PRIMARY KEY, n INT, {TS})")
        db.execute("INSERT INTO flags (flag, n) VALUES (1, 1)")
    env.write_config(f"  - name: crm.{env.database}.flags\n{CHUNKED_POLL}")
    refused = "flags cannot be keyed on flag: .*tinyint\\(1\\) is read as a boolean, so 1 and 2.*TINYINT\\(4\\)"
    with pytest.raises(SourceTableError, match=refused):
        Lake(env.config, spark).snapshot(f"crm.{env.database}.flags", "g1")
    with pytest.raises(SourceTableError, match=refused):
        env.poll()


def test_a_configured_key_the_source_holds_twice_fails_completeness(env: PollingEnv, spark: Any) -> None:
    """A polled table without a primary key, keyed in the config on a column MariaDB does
    not keep unique: a second row with a key current already holds leaves current a row
    short. The check compared keys only and passed; it counts the source's rows per key now."""
    with env.db() as db:
        db.execute(f"CREATE TABLE visits (page VARCHAR(10) NOT NULL, n INT, {TS})")
        db.execute("INSERT INTO visits (page, n) SELECT CONCAT('p', seq), seq FROM seq_1_to_20")
    env.write_config(
        f"  - name: crm.{env.database}.visits\n    primary_key: [page]\n"
        "    poll: {mode: timestamp, timestamp_column: ts}\n    changelog: {grace_s: 0}\n"
    )
    lake = Lake(env.config, spark)
    key = f"crm.{env.database}.visits"
    env.poll()
    lake.snapshot(key, "g1")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.db() as db:
        db.execute("INSERT INTO visits (page, n) VALUES ('p7', 7)")  # the same row again
    _window(env, lake, key, start)
    lake.current(key)
    assert lake.read_current(key).count() == 20  # 21 rows in the source
    report = lake.completeness(key)
    assert not report.passed
    assert report.repeated == 1 and 'repeated in the source {"page": "p7"}' in report.sample, report.sample


def test_a_change_the_cursor_passed_over_fails_completeness(env: PollingEnv, spark: Any) -> None:
    """A transaction that commits after a poll has read past its rows' timestamp is passed
    by the cursor (README, "Polled sources"): current keeps the old row. The completeness
    check compared keys only for polled tables and passed; it compares rows now, with the
    poller running as a user runs it, and names the cause and the fix."""
    from cdc_platform.lake.checks import CompletenessReport

    env.write_config(f"  - name: crm.{env.database}.accounts\n    poll: {POLL}}}\n    changelog: {{grace_s: 0}}\n")
    lake = Lake(env.config, spark)
    key = f"crm.{env.database}.accounts"
    with env.db() as db:
        db.executemany("INSERT INTO accounts (email, balance) VALUES (%s, 1)", [(f"a{i}@x.io",) for i in range(10)])
    env.poll()
    lake.snapshot(key, "g1")
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    with env.db() as late:
        late.execute("BEGIN")
        late.execute("UPDATE accounts SET balance = 111 WHERE id = 1")  # its updated_at: now
        with env.db() as db:
            db.execute("UPDATE accounts SET balance = 222 WHERE id = 2")  # later, committed first
        env.poll()  # the cursor moves past both timestamps; row 1's change is not committed yet
        late.execute("COMMIT")
    _window(env, lake, key, start)
    lake.current(key)
    applied = _lake(lake, key)
    assert (str(applied[1]["balance"]), str(applied[2]["balance"])) == ("1.00", "222.00")  # passed over
    with env.db() as db:
        db.execute("DELETE FROM accounts WHERE id = 9")  # a hard delete: a warning, as before

    def started_not_yet_polled() -> None:  # a check reading now must wait for its first poll
        assert "is it running?" in _wait_for_a_poll_after_now(env, deadline_s=1.0)

    def completeness_while_polling() -> CompletenessReport:
        with env.running_poller(before_polling=started_not_yet_polled):
            source = open_source(env.config, env.source)
            assert not source.stored_cursors()[key].stopped, "a started poller still looks exited to a waiting check"
            silence = source.capture_silences().get(key)
            assert silence is not None and not silence.stalled, silence  # the fresh check's view: polling
            return lake.completeness(key)

    # a poller started after a silence longer than a dead poller's (a quiet hour, a redeploy)
    # is alive before its first full read: the check must wait for that read, not give up
    _wait_past_the_silence_of_a_dead_poller(env, key)
    silence = open_source(env.config, env.source).capture_silences().get(key)
    assert silence is not None and silence.stalled, silence  # the fresh check's view: nothing polls
    assert "cdc-platform capture run --source crm" in silence.advice
    report = completeness_while_polling()
    assert report.compared and not report.passed, report.compare_note
    assert (report.differing, report.missing, report.extra, report.deleted_in_source) == (1, 0, 0, 1), report.sample
    assert sorted(report.sample) == ['deleted in source {"id": 9}', 'differs {"id": 1}']
    described = report.description(key, polled=True)
    assert described is not None and "poll.timestamp_delay_s" in described and "rehydrate" in described
    # the poller exited: no poll will begin after the read; the check says so and compares the keys
    keys_only = lake.completeness(key)
    assert not keys_only.compared and keys_only.deleted_in_source == 1
    assert "the poller stopped (its cursors say so)" in keys_only.compare_note, keys_only.compare_note


def _wait_past_the_silence_of_a_dead_poller(env: PollingEnv, key: str) -> None:
    source = open_source(env.config, env.source)
    assert isinstance(source, MysqlConnector)
    silent_ns = CAUGHT_UP_EVERY_NS + 3 * int(source.endpoint.config.poll_interval_s * 1e9) + 10**9
    # the rule's own "last seen": a poller's start counts as a sign of life, not only a full read
    last_seen_at = source.stored_cursors()[key].alive_at()
    now_ns = _database_clock_ns(env)
    time.sleep(max(0.0, (last_seen_at + silent_ns - now_ns) / 1e9))


def _database_clock_ns(env: PollingEnv) -> int:
    with env.db() as db:
        db.execute(CLOCK_SQL)
        return int(db.fetchone()[0]) * 1000


def _wait_for_a_poll_after_now(env: PollingEnv, deadline_s: float) -> str:
    """What a check that read the source now hears while it waits for the poller."""
    now_ns = _database_clock_ns(env)
    source = open_source(env.config, env.source)
    return source.wait_until_captured(now_ns, time.monotonic() + deadline_s, stop_when_unread=True)
