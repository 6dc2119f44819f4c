"""A streamed table without services: a committed generation written as the platform
writes one, and change events in the changelog's row shape, for tests of the merge rules
on exact positions (a real source cannot be made to re-send a given event)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cdc_platform.config.model import PlatformConfig
from cdc_platform.envelope.pgtypes import builtin_type
from cdc_platform.lake.ledger import Ledger
from cdc_platform.lake.tables import lake_table
from cdc_platform.model.generations import GenerationEvent, GenerationStatus, Watermark
from cdc_platform.model.tables import LakeColumn, TableSchema

ROW = "struct<id:bigint,v:bigint>"


class StreamedTable:
    """``t(id bigint primary key, v bigint)`` with generation ``g1`` of ``rows`` at watermark 50."""

    def __init__(self, spark: Any, root: Path, rows: list[tuple[int, int]]) -> None:
        self.spark = spark
        config = PlatformConfig.model_validate(
            {
                "sources": {"s": {"database": "d", "user": "u", "password_env": "UNUSED"}},
                "kafka": {"bootstrap_servers": "127.0.0.1:1"},
                "lake": {"root": str(root / "lake")},
                "tables": [{"name": "s.public.t", "primary_key": ["id"]}],
            }
        )
        self.table = lake_table(config, config.tables[0])
        self.ledger = Ledger(config.lake.root)
        self.offset = 0
        self.new_generation("g1", rows, 50)

    def new_generation(self, name: str, rows: list[tuple[int, int]], position: int) -> None:
        """Generation ``name`` of ``rows`` committed, its watermark at ``position`` and at
        the next Kafka offset (the stream apply rebuilds current from it)."""
        frame = self.spark.createDataFrame(rows, "id long, v long")
        frame.write.format("delta").save(self.table.snapshot_path(name))
        int8 = builtin_type(20)
        assert int8 is not None
        schema = TableSchema((LakeColumn("id", int8), LakeColumn("v", int8)), ("id",))
        self.ledger.record_generation(
            GenerationEvent(
                self.table.key,
                name,
                GenerationStatus.COMMITTED,
                watermark=Watermark(position, {0: self.offset}, datetime.now(UTC)),
                schema_json=schema.to_json(),
            )
        )

    def apply(
        self, events: list[tuple[str, int, int, int]], toasted: frozenset[int] = frozenset(),
        added: dict[str, str] | None = None,
    ) -> list[tuple[int, int]]:  # fmt: skip
        """``events`` (see ``events``) as one decoded stream batch merged into current as the
        stream apply merges it (``apply_decoded``); current's rows after it, every one, sorted.
        ``added``: text columns the source added, with the value every image carries."""
        from pyspark.sql import functions as F

        from cdc_platform.lake.current import apply_decoded, summarize

        frame = self.events(events, toasted)
        for name, value in (added or {}).items():
            for image in ("before", "after"):
                frame = frame.withColumn(image, F.col(image).withField(name, F.lit(value).cast("string")))
        frame = frame.cache()
        position = self.ledger.current(self.table.key)
        committed = self.ledger.committed(self.table.key)
        assert position is not None and committed is not None
        frontier = {0: position.frontier.get(0, 0) + len(events)}
        apply_decoded(self.spark, self.ledger, self.table, committed, position, frame, summarize(frame), frontier)
        frame.unpersist()
        rows = self.spark.read.format("delta").load(self.table.current_path).collect()
        return sorted((r["id"], r["v"]) for r in rows)

    def events(self, events: list[tuple[str, int, int, int]], toasted: frozenset[int] = frozenset()) -> Any:
        """(op, id, v, commit position) as changelog rows, at the next Kafka offsets (a
        truncate, ``t``, has no image: its id and v are ignored). The events at the indexes in
        ``toasted`` do not carry ``v`` (an unchanged TOASTed value:
        NULL in the image, listed as unavailable)."""
        rows = []
        for i, (op, key, value, commit) in enumerate(events):
            image = {"id": key, "v": None if i in toasted else value}
            before, after = {"d": (image, None), "t": (None, None)}.get(op, (None, image))
            rows.append((0, self.offset, op, commit, commit, before, after, ["v"] if i in toasted else []))
            self.offset += 1
        return self.spark.createDataFrame(
            [
                {
                    "kafka_partition": p,
                    "kafka_offset": o,
                    "kafka_timestamp": datetime.now(UTC),
                    "op": op,
                    "is_tombstone": False,
                    "commit_lsn": c,
                    "lsn": lsn,
                    "tx_id": c,
                    "source_ts": datetime.now(UTC),
                    "key_json": None,
                    "before": b,
                    "after": a,
                    "unavailable": unavailable,
                    "window_start": "w",
                }
                for p, o, op, c, lsn, b, a, unavailable in rows
            ],
            "kafka_partition int, kafka_offset long, kafka_timestamp timestamp, op string, is_tombstone boolean, "
            f"commit_lsn long, lsn long, tx_id long, source_ts timestamp, key_json string, before {ROW}, "
            f"after {ROW}, unavailable array<string>, window_start string",
        )
