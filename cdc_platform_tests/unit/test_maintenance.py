"""Old files of the lake's tables (``lake.maintenance``): which files a VACUUM deletes, how
often the stream apply runs one, and what the config says. delta-rs on a local directory,
no services."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform.lake.maintenance import VacuumCadence, vacuum_table, vacuumed_paths


def _lake_table(root: Path, **lake: Any) -> Any:
    from cdc_platform.config.model import PlatformConfig
    from cdc_platform.lake.tables import lake_table

    config = PlatformConfig.model_validate(
        {"sources": {"s": {"database": "d", "user": "u", "password_env": "UNUSED"}},
         "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "lake": {"root": str(root), **lake},
         "tables": [{"name": "s.public.t", "primary_key": ["id"]}]}
    )  # fmt: skip
    return lake_table(config, config.tables[0])


def _data_files(path: str) -> set[str]:
    return {f for f in os.listdir(path) if f.endswith(".parquet")}


def _current_merged_three_times(table: Any) -> None:
    """Current written by delta-rs, then three batches merged into it as the driver merges
    them (copy on write: each rewrites the file it touches and the log records the old one
    as removed)."""
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(table.current_path, pa.table({"id": list(range(100)), "v": [0] * 100}))
    for batch in range(1, 4):
        DeltaTable(table.current_path).merge(
            pa.table({"id": [batch], "v": [batch]}), "t.id = s.id", source_alias="s", target_alias="t"
        ).when_matched_update_all().execute()


def test_a_vacuum_deletes_the_files_merges_replaced_and_keeps_the_live_ones(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table = _lake_table(tmp_path, retain_old_files_hours=0)
    _current_merged_three_times(table)
    live = {Path(f).name for f in DeltaTable(table.current_path).file_uris()}
    assert len(live) == 1 and len(_data_files(table.current_path)) == 4  # three replaced files on disk

    done = vacuum_table(table)
    assert (done.files_deleted, done.failures) == (3, ())
    assert _data_files(table.current_path) == live
    rows = DeltaTable(table.current_path).to_pyarrow_table().sort_by("id")
    assert rows["v"].to_pylist()[:5] == [0, 1, 2, 3, 0] and rows.num_rows == 100


def test_files_replaced_within_the_retention_stay(tmp_path: Path) -> None:
    table = _lake_table(tmp_path)  # the default: 24 hours
    assert table.retain_old_files_hours == 24
    assert table.retention == {"delta.deletedFileRetentionDuration": "interval 24 hours"}
    _current_merged_three_times(table)
    assert vacuum_table(table).files_deleted == 0 and len(_data_files(table.current_path)) == 4


def test_a_table_that_fails_is_reported_and_the_others_are_still_vacuumed(tmp_path: Path) -> None:
    table = _lake_table(tmp_path, retain_old_files_hours=0)
    _current_merged_three_times(table)
    os.makedirs(f"{table.changelog_path}/_delta_log")
    Path(f"{table.changelog_path}/_delta_log/00000000000000000000.json").write_text("not a commit\n")

    done = vacuum_table(table)
    assert done.files_deleted == 3  # current's, though the changelog's log is unreadable
    assert len(done.failures) == 1 and done.failures[0].startswith(f"{table.changelog_path}: ")
    assert table.history_path not in vacuumed_paths(table)  # no history configured: not looked at


def test_each_table_is_vacuumed_on_its_first_pass_then_every_interval(tmp_path: Path) -> None:
    hourly, never = _lake_table(tmp_path), _lake_table(tmp_path, vacuum_every_minutes=None)
    assert hourly.vacuum_every_s == 3600 and never.vacuum_every_s is None
    cadence = VacuumCadence()
    assert cadence.due(hourly, 100.0) and not cadence.due(never, 100.0)
    assert cadence.maintain(hourly) is not None  # nothing written yet: nothing to delete, no failure
    assert cadence.maintain(hourly) is None  # not due again within the hour
    assert cadence.maintain(never) is None


def test_a_negative_retention_or_interval_is_refused_naming_the_field(tmp_path: Path) -> None:
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="retain_old_files_hours"):
        _lake_table(tmp_path, retain_old_files_hours=-1)
    with pytest.raises(pydantic.ValidationError, match="vacuum_every_minutes"):
        _lake_table(tmp_path, vacuum_every_minutes=-5)
