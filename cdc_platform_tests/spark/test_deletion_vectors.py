"""Deletion-vector files of a table Spark wrote and checkpointed (``lake.deletion_vectors``):
after the log's JSON commits before the checkpoint are gone, the files the table still
uses are found in Spark's checkpoint, the replaced ones are deleted, and Spark reads the
same rows. Spark and Delta only, no other service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc_platform.lake.deletion_vectors import delete_replaced_vectors, read_log

pytestmark = [pytest.mark.integration]


def test_replaced_vectors_of_a_checkpointed_table_go_and_its_rows_stay(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "current")
    properties = {"delta.enableDeletionVectors": "true", "delta.checkpointInterval": "3"}
    spark.range(0, 2000, 1, 2).write.format("delta").options(**properties).save(path)
    for step in range(5):  # each DELETE replaces both files' vectors; Spark checkpoints at version 3
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 97 = {step}")
    log = Path(path, "_delta_log")
    assert (log / f"{3:020d}.checkpoint.parquet").exists(), sorted(p.name for p in log.iterdir())
    for version in range(3):  # as Delta's log cleanup leaves it: the checkpoint is all that says what is live
        (log / f"{version:020d}.json").unlink()
    rows = sorted(r.id for r in spark.read.format("delta").load(path).collect())
    on_disk = {p.name for p in Path(path).glob("deletion_vector_*.bin")}
    live = read_log(path).in_use(removed_after_ms=2**62)
    assert live and live < on_disk and len(on_disk - live) >= 4  # the last DELETE's vectors, and four replaced

    deleted = delete_replaced_vectors(path, 0)
    assert sorted(deleted) == sorted(on_disk - live)
    assert {p.name for p in Path(path).glob("deletion_vector_*.bin")} == live
    spark.catalog.clearCache()
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == rows
    assert len(rows) == 2000 - sum(1 for i in range(2000) if i % 97 < 5)
