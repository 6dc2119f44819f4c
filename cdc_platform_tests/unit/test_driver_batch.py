"""A small stream batch finished in the driver (no Spark here): its latest event per key and
its statistics from Arrow follow the merge's rules. Spark's own aggregation is compared
with them on real frames in ``spark/test_current.py`` and ``spark/test_jvm_decode.py``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from cdc_platform.lake.driver_batch import DEAD, kind_statistics
from cdc_platform.lake.driver_merge import latest_in_driver

IMAGE = pa.struct([("id", pa.int64()), ("v", pa.string())])
AT = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _events(rows: list[dict[str, Any]]) -> pa.Table:
    """Change events in the changelog's column names (those the driver reads)."""
    defaults = {"before": None, "after": None, "unavailable": [], "error": None, "unknown_columns": None,
                "source_ts": AT, "kafka_partition": 0}  # fmt: skip
    schema = pa.schema(
        [("kafka_partition", pa.int32()), ("kafka_offset", pa.int64()), ("op", pa.string()),
         ("commit_lsn", pa.int64()), ("lsn", pa.int64()), ("source_ts", pa.timestamp("us", "UTC")),
         ("before", IMAGE), ("after", IMAGE), ("unavailable", pa.list_(pa.string())), ("error", pa.string()),
         ("unknown_columns", pa.list_(pa.string()))]
    )  # fmt: skip
    return pa.Table.from_pylist([{**defaults, "kafka_offset": i, **r} for i, r in enumerate(rows)], schema)


def _latest(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    latest = latest_in_driver(_events(rows), ["id"], ["v"])
    assert latest is not None
    return {r["__key_0"]: r for r in latest.to_pylist()}


def test_the_latest_event_of_a_key_is_the_greatest_position_not_the_last_offset() -> None:
    latest = _latest(
        [
            {"op": "u", "commit_lsn": 20, "lsn": 5, "after": {"id": 1, "v": "newest"}},
            {"op": "u", "commit_lsn": 10, "lsn": 9, "after": {"id": 1, "v": "older, later offset"}},
            # the same position in two partitions: the partition, then the offset, decides
            {"op": "u", "commit_lsn": 30, "lsn": 1, "after": {"id": 2, "v": "partition 1"}, "kafka_partition": 1},
            {"op": "u", "commit_lsn": 30, "lsn": 1, "after": {"id": 2, "v": "partition 0"}},
        ]
    )
    assert (latest[1]["__val_0"], latest[1]["__commit"], latest[1]["__lsn"]) == ("newest", 20, 5)
    assert latest[2]["__val_0"] == "partition 1"


def test_a_toasted_value_and_a_delete_carry_nothing_and_a_real_null_is_a_value() -> None:
    latest = _latest(
        [
            {"op": "c", "commit_lsn": 1, "lsn": 1, "after": {"id": 1, "v": "kept"}},
            {"op": "u", "commit_lsn": 2, "lsn": 2, "after": {"id": 1, "v": None}, "unavailable": ["v"]},
            {"op": "u", "commit_lsn": 3, "lsn": 3, "after": {"id": 2, "v": None}},
            {"op": "u", "commit_lsn": 4, "lsn": 4, "after": {"id": 3, "v": None}, "unavailable": ["v"]},
            {"op": "d", "commit_lsn": 5, "lsn": 5, "before": {"id": 4, "v": None}},
            {"op": "t", "commit_lsn": 6, "lsn": 6},  # a truncate is not a key's event
        ]
    )
    assert sorted(latest) == [1, 2, 3, 4]
    assert (latest[1]["__op"], latest[1]["__has_0"], latest[1]["__val_0"]) == ("u", True, "kept")
    assert (latest[2]["__has_0"], latest[2]["__val_0"]) == (True, None)  # NULL set by the source
    assert latest[3]["__has_0"] is False  # current keeps its value
    assert (latest[4]["__op"], latest[4]["__has_0"], latest[4]["__commit"]) == ("d", False, 5)


def test_a_float_key_is_left_to_spark() -> None:
    events = _events([{"op": "c", "commit_lsn": 1, "lsn": 1, "after": {"id": 1, "v": "x"}}])
    floating = pa.struct([("id", pa.float64()), ("v", pa.string())])
    schema = events.schema.set(events.schema.get_field_index("after"), pa.field("after", floating))
    assert latest_in_driver(events.cast(schema), ["id"], ["v"]) is None


def test_statistics_per_kind_of_record() -> None:
    kinds = {
        k["kind"]: k
        for k in kind_statistics(
            _events(
                [
                    {"op": "c", "commit_lsn": 7, "lsn": 7, "after": {"id": 1, "v": "x"}, "unknown_columns": ["new"]},
                    {"op": "c", "commit_lsn": 3, "lsn": 3, "after": {"id": 2, "v": "x"}},
                    {"op": "t", "commit_lsn": 9, "lsn": 2},
                    {"op": "t", "commit_lsn": 9, "lsn": 4},
                    {"op": None, "commit_lsn": None, "lsn": None, "source_ts": None},
                    {"op": None, "error": "not JSON", "source_ts": None, "commit_lsn": None, "lsn": None},
                ]
            )
        )
    }
    assert set(kinds) == {"c", "t", "tombstone", DEAD}
    assert (kinds["c"]["n"], kinds["c"]["lo"], kinds["c"]["hi"], kinds["c"]["unknown"]) == (2, 3, 7, ["new"])
    assert kinds["t"]["t"] == {"commit_lsn": 9, "lsn": 4} and kinds["c"]["t"] is None
    assert (kinds["tombstone"]["n"], kinds[DEAD]["n"], kinds[DEAD]["ts"]) == (1, 1, None)


def _lake_table(driver_merge_max_rows: int | None) -> Any:
    from cdc_platform.config.model import PlatformConfig
    from cdc_platform.lake.tables import lake_table

    lake: dict[str, Any] = {"root": "/unused"}
    if driver_merge_max_rows is not None:
        lake["driver_merge_max_rows"] = driver_merge_max_rows
    config = PlatformConfig.model_validate(
        {"sources": {"s": {"database": "d", "user": "u", "password_env": "UNUSED"}},
         "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "lake": lake, "tables": [{"name": "s.public.t"}]}
    )  # fmt: skip
    return lake_table(config, config.tables[0])


def test_which_currents_merge_in_the_driver_follows_lake_driver_merge_max_rows() -> None:
    """Unset, currents up to 1M rows merge by delta-rs, batches up to the default batch's
    size; a user who raises the bound gets the driver's copy on write for bigger currents,
    and 0 keeps every current with rows in Spark."""
    from cdc_platform.config.model import ApplyConfig
    from cdc_platform.lake.driver_merge import DRIVER_MERGE_MAX_CHANGES, merges_in_driver

    assert ApplyConfig().max_offsets_per_batch <= DRIVER_MERGE_MAX_CHANGES  # a default batch may merge in the driver

    def in_driver(bound: int | None, rows: int, changes: int = 100) -> bool:
        return merges_in_driver(_lake_table(bound), rows, changes, False, ["id", "v"])

    assert in_driver(None, 1_000_000) and not in_driver(None, 1_000_001)
    assert in_driver(10_000_000, 10_000_000) and not in_driver(10_000_000, 10_000_001)
    assert not in_driver(0, 1) and not in_driver(0, 0)
    big = DRIVER_MERGE_MAX_CHANGES + 1
    assert in_driver(None, 100_000, changes=DRIVER_MERGE_MAX_CHANGES)  # a default batch of 200k offsets
    assert not in_driver(10_000_000, 5_000_000, changes=big)  # a bigger one is Spark's whatever the bound


def test_a_negative_driver_merge_bound_is_refused_naming_the_field() -> None:
    import pydantic
    import pytest

    with pytest.raises(pydantic.ValidationError, match="driver_merge_max_rows"):
        _lake_table(-5)


# ------------------------------------------------------------------ which batches the driver holds


def _table(root: Any, **settings: Any) -> Any:
    from cdc_platform.config.model import PlatformConfig
    from cdc_platform.lake.tables import lake_table

    history = settings.pop("history", False)
    config = PlatformConfig.model_validate(
        {"sources": {"s": {"database": "d", "user": "u", "password_env": "UNUSED"}},
         "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "lake": {"root": str(root), **settings},
         "tables": [{"name": "s.public.t", "primary_key": ["id"], "history": history}]}
    )  # fmt: skip
    return lake_table(config, config.tables[0])


def _current(table: Any, rows: int, text_bytes: int) -> None:
    """Current written by delta-rs: ``rows`` rows whose text column holds ``text_bytes`` each."""
    from deltalake import write_deltalake

    values = [f"{i:0{text_bytes}d}" for i in range(rows)]  # unique: Parquet stores them plain
    write_deltalake(table.current_path, pa.table({"id": list(range(rows)), "v": values}))


def _batch(records: int) -> Any:
    from cdc_platform.model.windows import WindowPlan, WindowRange, batch_key

    half = records // 2  # two Kafka partitions
    ranges = (WindowRange(0, 100, 100 + half, ""), WindowRange(1, 0, records - half, ""))
    return WindowPlan(batch_key("2026-12-05", 7), ranges, reused=False)


def _fresh_estimates() -> None:
    from cdc_platform.lake import driver_batch

    driver_batch._estimated.clear()
    driver_batch._held.clear()


def test_a_backlog_batch_of_narrow_rows_is_held_in_the_driver_and_a_wide_one_is_not(tmp_path: Any) -> None:
    """The driver holds a batch whose records are estimated to fit ``lake.driver_batch_max_mb``:
    200 000 changes of a narrow table (about 60 MB), not of a table with 2 KB rows (~800 MB)."""
    from cdc_platform.lake.driver_batch import current_estimate, fits_in_driver

    _fresh_estimates()
    narrow, wide = _table(tmp_path / "narrow"), _table(tmp_path / "wide")
    _current(narrow, 1000, 40)
    _current(wide, 1000, 2000)
    narrow_bytes = current_estimate(narrow).record_bytes
    assert narrow_bytes is not None and 2 * 48 < narrow_bytes < 2 * 48 + 400  # two images of ~48 bytes
    assert current_estimate(narrow).rows == 1000
    assert fits_in_driver(_batch(200_000), narrow)
    assert not fits_in_driver(_batch(200_000), wide)
    assert fits_in_driver(_batch(30_000), wide)  # 30 000 x ~4 KB: within 128 MB
    assert not fits_in_driver(_batch(30_000), _table(tmp_path / "wide", driver_batch_max_mb=64))
    assert not fits_in_driver(_batch(100), _table(tmp_path / "narrow", driver_batch_max_mb=0))  # 0: never


def test_a_backlog_batch_is_held_only_where_the_merge_stays_in_the_driver(tmp_path: Any) -> None:
    """Above 10 000 records the batch is held only when delta-rs merges it (current, and
    history if the table keeps one, within ``lake.driver_merge_max_rows``): a Spark MERGE
    would ship the rows back."""
    from deltalake import write_deltalake

    from cdc_platform.lake.driver_batch import fits_in_driver

    _fresh_estimates()
    _current(_table(tmp_path), 1000, 10)
    assert fits_in_driver(_batch(50_000), _table(tmp_path))
    assert not fits_in_driver(_batch(50_000), _table(tmp_path, driver_merge_max_rows=999))
    assert not fits_in_driver(_batch(50_000), _table(tmp_path, history=True))  # no history yet: not known small
    assert fits_in_driver(_batch(10_000), _table(tmp_path, history=True))  # a micro-batch: held as before
    assert not fits_in_driver(_batch(200_001), _table(tmp_path))  # more than the driver merge takes
    write_deltalake(_table(tmp_path).history_path, pa.table({"id": list(range(1500))}))
    _fresh_estimates()
    assert fits_in_driver(_batch(50_000), _table(tmp_path, history=True))  # history small too: all in the driver
    _fresh_estimates()
    assert not fits_in_driver(_batch(50_000), _table(tmp_path, history=True, driver_merge_max_rows=1200))


def test_without_current_a_record_count_bounds_the_batch_and_a_held_batch_teaches_its_size(tmp_path: Any) -> None:
    from cdc_platform.lake.driver_batch import current_estimate, fits_in_driver, remember_held

    _fresh_estimates()
    table = _table(tmp_path)
    assert current_estimate(table).record_bytes is None  # no current yet
    assert fits_in_driver(_batch(10_000), table) and not fits_in_driver(_batch(10_001), table)
    _current(table, 1000, 10)
    _fresh_estimates()
    assert fits_in_driver(_batch(100_000), table)
    # values Parquet stores in a dictionary look small in its footer: what a held batch took wins
    remember_held(table, pa.table({"v": ["x" * 4000] * 10}))
    assert current_estimate(table).record_bytes > 4000
    assert not fits_in_driver(_batch(100_000), table)


def test_a_driver_merge_collects_only_what_the_estimate_fits(tmp_path: Any) -> None:
    """A batch the driver does not hold merges there only when its latest rows (at most one
    per change) fit ``lake.driver_batch_max_mb``: 200 000 changes of 2 KB rows would be
    ~800 MB collected into the driver, past Spark's default result limit (1 GB) with both
    images; Spark's MERGE takes them. 0: the driver collects nothing."""
    from cdc_platform.lake.driver_batch import collects_in_driver

    _fresh_estimates()
    narrow, wide = _table(tmp_path / "narrow"), _table(tmp_path / "wide")
    assert collects_in_driver(narrow, 200_000)  # no current yet: the merge's own bounds decide
    _current(narrow, 1000, 40)
    _current(wide, 1000, 2000)
    assert collects_in_driver(narrow, 200_000)
    assert not collects_in_driver(wide, 200_000)
    assert collects_in_driver(wide, 30_000)
    assert not collects_in_driver(_table(tmp_path / "narrow", driver_batch_max_mb=0), 10)


def test_a_batch_too_big_for_the_driver_sends_the_table_to_spark_for_a_while(
    tmp_path: Any, monkeypatch: Any, caplog: Any
) -> None:
    """Spark refusing a collect's results (or Python out of memory) is the driver's limit, not
    the batch's error: the table's batches go through Spark for ``ESTIMATE_TTL_S``, with one
    warning naming the settings, then the driver is tried again. Other errors are not
    mistaken for it (they are the batch's, whichever path reads it)."""
    import logging

    from cdc_platform.lake import driver_batch
    from cdc_platform.lake.driver_batch import collects_in_driver, fits_in_driver, too_big, too_big_for_driver

    refused = RuntimeError(
        "An error occurred while calling o1234.collectAsArrowToPython. : org.apache.spark.SparkException: Job "
        "aborted due to stage failure: Total size of serialized results of 1 tasks (16.2 MiB) is bigger than "
        "spark.driver.maxResultSize (4.0 MiB)"
    )
    assert too_big_for_driver(refused) and too_big_for_driver(MemoryError())
    assert not too_big_for_driver(RuntimeError("org.apache.kafka.common.errors.TimeoutException: Timed out"))
    _fresh_estimates()
    driver_batch._too_big.clear()
    table, other = _table(tmp_path / "t"), _table(tmp_path / "other")
    _current(table, 1000, 10)
    _current(other, 1000, 10)
    assert fits_in_driver(_batch(1000), table) and collects_in_driver(table, 1000)
    with caplog.at_level(logging.WARNING, logger=driver_batch.log.name):
        too_big(table, "a batch of 1000 records", refused)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "too big for the driver" in warning and "spark.driver.maxResultSize" in warning
    assert "lake.driver_batch_max_mb" in warning
    assert "(16.2 MiB) is bigger than spark.driver.maxResultSize (4.0 MiB)" in warning  # the figures, not a trace
    assert not fits_in_driver(_batch(1000), table) and not collects_in_driver(table, 1000)
    assert fits_in_driver(_batch(1000), other)  # only that table
    later = driver_batch.time.monotonic() + driver_batch.ESTIMATE_TTL_S + 1
    monkeypatch.setattr(driver_batch.time, "monotonic", lambda: later)
    assert fits_in_driver(_batch(1000), table)  # tried again: the wide burst may be over
