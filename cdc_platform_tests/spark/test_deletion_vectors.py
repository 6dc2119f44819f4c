"""Deletion-vector files of a table Spark wrote and checkpointed (``lake.deletion_vectors``):
after the log's JSON commits before the checkpoint are gone, the files the table still
uses are found in Spark's checkpoint, the replaced ones are deleted, and Spark reads the
same rows. On the local disk (Spark and Delta only) and on the S3 store (S3Proxy, whose
objects are files under its data directory)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.config.model import LakeConfig, S3Config
from cdc_platform.devtools.stack.s3proxy import ACCESS_KEY_ID_ENV, SECRET_ACCESS_KEY_ENV
from cdc_platform.lake.deletion_vectors import delete_replaced_vectors, read_log
from cdc_platform.lake.object_store import give_session_object_store, prepare_lake_environment

pytestmark = [pytest.mark.integration]


def _replaced_vectors_go_and_rows_stay(spark: Any, path: str, stored: Path) -> None:
    """``path``: the table as the lake names it; ``stored``: where its files are on disk."""
    properties = {"delta.enableDeletionVectors": "true", "delta.checkpointInterval": "3"}
    spark.range(0, 2000, 1, 2).write.format("delta").options(**properties).save(path)
    for step in range(5):  # each DELETE replaces both files' vectors; Spark checkpoints at version 3
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 97 = {step}")
    log = stored / "_delta_log"
    assert (log / f"{3:020d}.checkpoint.parquet").exists(), sorted(p.name for p in log.iterdir())
    for version in range(3):  # as Delta's log cleanup leaves it: the checkpoint is all that says what is live
        (log / f"{version:020d}.json").unlink()
    rows = sorted(r.id for r in spark.read.format("delta").load(path).collect())
    on_disk = {p.name for p in stored.glob("deletion_vector_*.bin")}
    live = read_log(path).in_use(removed_after_ms=2**62)
    assert live and live < on_disk and len(on_disk - live) >= 4  # the last DELETE's vectors, and four replaced

    deleted = delete_replaced_vectors(path, 0)
    assert sorted(deleted) == sorted(on_disk - live)
    assert {p.name for p in stored.glob("deletion_vector_*.bin")} == live
    spark.catalog.clearCache()
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == rows
    assert len(rows) == 2000 - sum(1 for i in range(2000) if i % 97 < 5)


def test_replaced_vectors_of_a_checkpointed_table_go_and_its_rows_stay(spark: Any, tmp_path: Path) -> None:
    _replaced_vectors_go_and_rows_stay(spark, str(tmp_path / "current"), tmp_path / "current")


def test_replaced_vectors_on_an_s3_store_go_and_the_rows_stay(spark: Any, s3_store: Any) -> None:
    """A lake on object storage: the apply's VACUUM deletes the vectors Spark's MERGEs
    replaced there too, or a big current merged every few seconds keeps a file per batch."""
    prefix = f"dv-{uuid.uuid4().hex[:8]}"
    s3 = S3Config(
        endpoint=s3_store.endpoint, path_style=True,
        access_key_id_env=ACCESS_KEY_ID_ENV, secret_access_key_env=SECRET_ACCESS_KEY_ENV,
    )  # fmt: skip
    lake = LakeConfig(root=f"{s3_store.bucket('lake')}/{prefix}", s3=s3)
    prepare_lake_environment(lake)  # as loading the config does
    give_session_object_store(spark, lake)
    _replaced_vectors_go_and_rows_stay(spark, f"{lake.root}/current", s3_store.data / "lake" / prefix / "current")
