"""The ledger on a real (local) Delta store, through delta-rs: what is written is read back
typed, appends from several writers never lose each other, and reads stay cheap."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.envelope.pgtypes import builtin_type
from cdc_platform.lake import ledger as ledger_module
from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.coverage import OffsetRange, walk
from cdc_platform.model.errors import RetriableError
from cdc_platform.model.generations import GenerationEvent, GenerationStatus, Watermark
from cdc_platform.model.state import CurrentPosition, SchemaRecord
from cdc_platform.model.tables import LakeColumn, TableSchema
from cdc_platform.model.windows import BatchPlan, WindowPlan, WindowRange

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


def test_generations_round_trip_and_fold(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path))
    assert ledger.generations("s.t") == {} and ledger.committed("s.t") is None
    mark = Watermark(123, {0: 4, 1: 9}, T0)
    ledger.record_generation(GenerationEvent("s.t", "g1", GenerationStatus.REQUESTED, at=T0, cause="bootstrap",
                                             covers=("signal:x",), reason="bootstrap"))  # fmt: skip
    ledger.record_generation(
        GenerationEvent("s.t", "g1", GenerationStatus.RUNNING, at=T0 + timedelta(seconds=1), run_id="r1")
    )
    ledger.record_generation(
        GenerationEvent("s.t", "g1", GenerationStatus.COMMITTED, at=T0 + timedelta(seconds=9), watermark=mark, rows=7,
                        schema_json='{"key": [], "columns": []}')
    )  # fmt: skip
    ledger.record_generation(GenerationEvent("other.t", "g9", GenerationStatus.FAILED, at=T0, detail="fatal: no"))
    g = ledger.committed("s.t")
    assert g is not None
    assert (g.generation, g.status, g.cause, g.covers, g.run_id, g.rows, g.watermark) == (
        "g1", GenerationStatus.COMMITTED, "bootstrap", ("signal:x",), "r1", 7, mark,
    )  # fmt: skip
    state = ledger.read()
    assert set(state.generations) == {"s.t", "other.t"} and state.committed("other.t") is None


def test_windows_are_fixed_once(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path))
    first = WindowPlan("2026-11-23T10:00", (WindowRange(0, 0, 10, "2026-11-23T10:05"),), reused=False)
    racing = WindowPlan("2026-11-23T10:00", (WindowRange(0, 0, 12, "2026-11-23T10:05"),), reused=False)
    ledger.record_window("s.t", first)
    ledger.record_window("s.t", racing)  # a second writer of the same window: the first recording stands
    assert ledger.windows("s.t") == {"2026-11-23T10:00": first.ranges}
    assert ledger.windows("other.t") == {}


def test_ten_thousand_windows_are_read_back_whole(tmp_path: Path) -> None:
    """Bug 1: no cap on what a reader sees."""
    ledger = Ledger(str(tmp_path))
    plans = [
        WindowPlan(f"w{i:05d}", (WindowRange(0, i * 10, i * 10 + 10, f"w{i + 1:05d}"),), reused=False)
        for i in range(10_050)
    ]
    ledger.record_windows("s.t", plans)
    windows = ledger.read().windows["s.t"]
    assert len(windows) == 10_050
    assert walk({0: 0}, [r.offsets for rs in windows.values() for r in rs]).frontier == {0: 100_500}


def test_current_position_newest_wins(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path))
    ledger.record_current("s.t", CurrentPosition("g1", {0: 5}, 100, None, 3, T0))
    ledger.record_current("s.t", CurrentPosition("g1", {0: 9, 1: 2}, 150, T0, 4, T0 + timedelta(seconds=1)))
    position = ledger.current("s.t")
    assert position is not None and (position.frontier, position.applied_position, position.rows) == (
        {0: 9, 1: 2},
        150,
        4,
    )


def test_a_ledger_written_before_a_column_was_added_reads_and_gains_it(tmp_path: Path) -> None:
    """Existing lakes: a ``current`` table without ``truncate_commit``/``truncate_lsn`` (added
    2026-12-05) reads them as NULL (no truncate remembered), and the next record adds them."""
    import deltalake
    import pyarrow as pa

    ledger = Ledger(str(tmp_path / "lake"))
    before = pa.schema([f for f in ledger_module.SCHEMAS["current"] if not f.name.startswith("truncate_")])
    old_row = {"table": "t", "generation": "g1", "frontier": '{"0": 5}', "applied_position": 7,
               "last_source_ts": None, "rows": 3, "updated_at": datetime(2026, 1, 1, tzinfo=UTC)}  # fmt: skip
    deltalake.write_deltalake(ledger._path("current"), pa.Table.from_pylist([old_row], schema=before))
    position = ledger.current("t")
    assert position is not None and (position.frontier, position.truncated_at) == ({0: 5}, None)
    ledger.record_current("t", CurrentPosition("g1", {0: 9}, 10, None, 4, truncated_at=(10, 11)))
    assert ledger.current("t") == ledger.read().current["t"]
    assert ledger.current("t").truncated_at == (10, 11)  # type: ignore[union-attr]
    assert len(ledger._rows("current")) == 2


def test_schema_history_and_the_schema_the_lake_decodes_with(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path))
    int4, text = builtin_type(23), builtin_type(25)
    assert int4 is not None and text is not None
    v1 = TableSchema((LakeColumn("id", int4, compat_type="integer"),), ("id",))
    v2 = TableSchema((*v1.columns, LakeColumn("note", text, compat_type="text")), ("id",))
    ledger.register_schema("s.t", SchemaRecord(1, "g1", v1.version().fingerprint(), v1.to_json(), "baseline"))
    ledger.register_schema("s.t", SchemaRecord(2, "g1", v2.version().fingerprint(), v2.to_json(), "added note"))
    assert [r.version for r in ledger.schema_history("s.t")] == [1, 2]
    assert ledger.latest_schema("s.t") == v2


def _append_windows(root: str, writer: int, start: Any) -> None:
    ledger = Ledger(root)
    start.wait()  # all writers race for the table's first commit, as CI's did
    for i in range(10):
        ledger.record_window("s.t", WindowPlan(f"{writer}-{i}", (WindowRange(writer, i, i + 1, ""),), reused=False))


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    # delta-rs' runtime does not survive fork: writers are spawned, as Dagster's run workers are
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    writers = [context.Process(target=_append_windows, args=(str(tmp_path), w, start)) for w in range(3)]
    for w in writers:
        w.start()
    start.set()
    for w in writers:
        w.join(60)
    assert [w.exitcode for w in writers] == [0, 0, 0]
    assert len(Ledger(str(tmp_path)).windows("s.t")) == 30


def test_a_commit_lost_to_another_writer_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CI lost a window this way: two writers created the table at once, delta-rs refused
    # the loser's commit ("Protocol changed since last commit") and the run failed
    import deltalake
    from deltalake.exceptions import CommitFailedError

    real_write = deltalake.write_deltalake
    lost: list[int] = []

    def lose_twice(*args: Any, **kwargs: Any) -> None:
        if len(lost) < 2:
            lost.append(1)
            raise CommitFailedError("Failed to commit transaction: Protocol changed since last commit")
        real_write(*args, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake", lose_twice)
    monkeypatch.setattr(ledger_module, "COMMIT_RETRY_BASE_S", 0.001)
    ledger = Ledger(str(tmp_path))
    ledger.record_window("s.t", WindowPlan("w1", (WindowRange(0, 0, 5, ""),), reused=False))
    assert len(lost) == 2
    assert list(ledger.windows("s.t")) == ["w1"]


def test_a_writer_that_keeps_losing_gives_up_as_retriable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deltalake
    from deltalake.exceptions import CommitFailedError

    def always_lose(*args: Any, **kwargs: Any) -> None:
        raise CommitFailedError("Failed to commit transaction: Protocol changed since last commit")

    monkeypatch.setattr(deltalake, "write_deltalake", always_lose)
    monkeypatch.setattr(ledger_module, "COMMIT_RETRY_BASE_S", 0.001)
    with pytest.raises(RetriableError, match=r"lost .* commits in a row"):
        Ledger(str(tmp_path)).record_window("s.t", WindowPlan("w1", (WindowRange(0, 0, 5, ""),), reused=False))


def test_maintenance_compacts_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltalake import DeltaTable

    monkeypatch.setattr(ledger_module, "MAINTAIN_EVERY", 5)
    ledger = Ledger(str(tmp_path))
    for i in range(10):
        ledger.record_current("s.t", CurrentPosition("g1", {0: i}, i, None, i, T0 + timedelta(seconds=i)))
    table = DeltaTable(f"{tmp_path}/_ledger/current")
    assert len(table.file_uris()) <= 2  # compacted at commit 5 and 10
    position = ledger.current("s.t")
    assert position is not None and position.frontier == {0: 9}


_READ_AND_EXIT = """
import sys
from cdc_platform.lake.ledger import Ledger
ledger = Ledger(sys.argv[1])
assert ledger.committed("s.t") is not None
print(len(ledger.read().generations))
"""


def test_a_short_process_that_reads_the_ledger_exits_cleanly(tmp_path: Path) -> None:
    """A CLI command reads the ledger and exits; delta-rs' pyarrow reader used to leave IO
    threads behind that aborted the process at exit about one time in two (exit 134), which
    broke `make demo` run twice. Several runs, every one must exit 0."""
    import subprocess
    import sys

    ledger = Ledger(str(tmp_path))
    mark = Watermark(1, {0: 1}, T0)
    ledger.record_generation(GenerationEvent("s.t", "g1", GenerationStatus.COMMITTED, at=T0, watermark=mark, rows=1))
    ledger.record_generation(GenerationEvent("s.u", "g1", GenerationStatus.FAILED, at=T0, detail="fatal: no"))
    runs = [
        subprocess.run(
            [sys.executable, "-c", _READ_AND_EXIT, str(tmp_path)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        for _ in range(8)
    ]
    assert [(r.returncode, r.stdout.strip()) for r in runs] == [(0, "2")] * 8, [r.stderr[-400:] for r in runs]


def test_a_chunked_generation_keeps_its_plan_and_the_chunks_it_wrote(tmp_path: Path) -> None:
    from cdc_platform.model.chunks import ChunkPlan

    ledger = Ledger(str(tmp_path))
    assert ledger.chunk_progress("s.t", "g1").plan is None
    plan = ChunkPlan(
        "g1", Watermark(5, {0: 3}, T0), "h1", 900, 2, ('"id" <= 10', '"id" > 10 AND "id" <= 20', '"id" > 20')
    )
    ledger.plan_chunks("s.t", plan)
    ledger.record_chunks_written("s.t", "g1", (0, 1))
    ledger.record_chunks_written("s.t", "g2", (2,))  # another generation's
    progress = ledger.chunk_progress("s.t", "g1")
    assert progress.plan == plan and progress.written == {0, 1}
    assert progress.plan.waves_left(set(progress.written)) == [(1, (2,))]
    # planned again (the table's shape changed): the chunks written under the old plan no longer count
    replanned = ChunkPlan("g1", Watermark(8, {0: 5}, T0 + timedelta(seconds=5)), "h2", 950, 2, ("TRUE",))
    ledger.plan_chunks("s.t", replanned)
    assert ledger.chunk_progress("s.t", "g1") == type(progress)(replanned, frozenset())


def test_a_window_records_what_it_wrote_and_an_older_ledger_gains_the_column(tmp_path: Path) -> None:
    """The day check counts a day's records back against what its batches wrote, from the
    ledger. A ledger written before the count was kept reads NULL for its windows (counted:
    not verified) and takes counted windows from then on."""
    import deltalake
    import pyarrow as pa

    old_schema = pa.schema([f for f in ledger_module.SCHEMAS["windows"] if f.name != "records"])
    old_row = {"table": "s.t", "window": "old", "window_end": "", "partition": 0, "start": 0, "end": 5,
               "recorded_at": datetime.now(UTC)}  # fmt: skip
    deltalake.write_deltalake(str(tmp_path / "_ledger" / "windows"), pa.Table.from_pylist([old_row], schema=old_schema))
    ledger = Ledger(str(tmp_path))
    two_partitions = (WindowRange(0, 5, 9, ""), WindowRange(1, 0, 3, ""))
    ledger.record_window("s.t", WindowPlan("new", two_partitions, reused=False), records=6)
    ledger.record_window("s.t", WindowPlan("new", two_partitions, reused=False), records=7)  # a racing second: ignored
    windows, written = ledger.windows_with_records("s.t")
    assert windows == ledger.windows("s.t") and set(windows) == {"old", "new"}
    assert written == {"old": None, "new": 6}


def test_a_ledger_that_read_a_table_sees_what_another_writer_added_since(tmp_path: Path) -> None:
    """A process keeps each ledger table's handle and its rows between reads (a restart read
    the same tables once per table, docs/benchmarks.md "Stop 76"); what another process
    committed since is read, never the rows kept from before."""
    reader, writer = Ledger(str(tmp_path)), Ledger(str(tmp_path))
    reader.register_schema("s.t", SchemaRecord(1, "g1", "f1", '{"key": [], "columns": []}', "baseline"))
    assert [r.version for r in reader.schema_history("s.t")] == [1]
    writer.register_schema("s.t", SchemaRecord(2, "g1", "f2", '{"key": [], "columns": []}', "added a column"))
    assert [r.version for r in reader.schema_history("s.t")] == [1, 2]
    writer.record_current("s.t", CurrentPosition("g1", {0: 5}, 100, None, 3, T0))
    assert reader.current("s.t") == writer.current("s.t")


def test_a_ledger_table_written_anew_under_a_kept_handle_is_read_anew(tmp_path: Path) -> None:
    """A ledger removed and started again (a lake wiped in place) is read as it is now."""
    import shutil

    ledger = Ledger(str(tmp_path))
    for at in range(3):
        ledger.record_current("s.t", CurrentPosition("g1", {0: at}, at, None, at, T0 + timedelta(seconds=at)))
    assert ledger.current("s.t").frontier == {0: 2}  # type: ignore[union-attr]
    shutil.rmtree(tmp_path / "_ledger" / "current")
    assert ledger.current("s.t") is None
    Ledger(str(tmp_path)).record_current("s.t", CurrentPosition("g2", {0: 9}, 9, None, 9, T0))
    position = ledger.current("s.t")
    assert position is not None and (position.generation, position.frontier) == ("g2", {0: 9})


def test_the_stream_starts_of_many_tables_are_each_tables_own(tmp_path: Path) -> None:
    """``stream_starts`` reads each ledger table once for all the tables a restart starts;
    each table's start is exactly what its own reads give."""
    ledger = Ledger(str(tmp_path))
    for n, table in enumerate(("s.a", "s.b", "s.c")):
        ledger.record_windows(table, [WindowPlan(f"w{i}", (WindowRange(0, i, i + 1, ""),), reused=False)
                                      for i in range(n + 1)])  # fmt: skip
        ledger.plan_batch(table, BatchPlan(n + 1, "2026-11-23", (OffsetRange(0, n + 1, n + 3),)))
        ledger.record_current(table, CurrentPosition("g1", {0: n + 1}, n, None, n, T0 + timedelta(seconds=n)))
    ledger.record_current("s.b", CurrentPosition("g1", {0: 7}, 7, None, 7, T0 + timedelta(seconds=9)))
    starts = ledger.stream_starts(["s.a", "s.b", "s.c", "s.none"])
    for table in ("s.a", "s.b", "s.c", "s.none"):
        own = (ledger.windows(table), ledger.last_batch(table), ledger.current(table))
        assert (starts[table].windows, starts[table].last_batch, starts[table].current) == own, table
    assert starts["s.b"].current is not None and starts["s.b"].current.frontier == {0: 7}
    assert starts["s.none"].last_batch is None and starts["s.none"].windows == {}


def test_a_delta_table_exists_once_it_has_a_commit(tmp_path: Path) -> None:
    """A first write that died before its commit leaves a log directory and no table: current
    is rebuilt then, not taken as there (``current.needs_rebuild``)."""
    import deltalake
    import pyarrow as pa

    from cdc_platform.lake.delta_rs import table_exists

    path = tmp_path / "current"
    assert not table_exists(str(path))
    (path / "_delta_log").mkdir(parents=True)
    assert not table_exists(str(path))
    deltalake.write_deltalake(str(path), pa.table({"id": [1]}))
    assert table_exists(str(path)) and table_exists(f"file://{path}")
