"""Dead letters marked examined stop counting against the threshold; new ones count.

The dead-letter table is written here with delta-rs in the columns the changelog writes
(``lake.changelog``); the Spark path that writes it is covered by ``spark/test_lake_files.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from cdc_platform.lake.dead_letters import count_dead_letters, marks_for_present, read_dead_letters
from cdc_platform.lake.ledger import Ledger
from cdc_platform.model.dead_letters import ExaminedMark, latest_marks

T0 = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
TOPIC = "shop.public.orders"


def _write(path: Path, letters: list[tuple[str, int, int, datetime]]) -> None:
    """Append dead letters (changelog partition, Kafka partition, offset, Kafka's timestamp)."""
    import deltalake

    data = pa.table(
        {
            "window_start": [w for w, _, _, _ in letters],
            "kafka_partition": pa.array([p for _, p, _, _ in letters], pa.int32()),
            "kafka_offset": pa.array([o for _, _, o, _ in letters], pa.int64()),
            "kafka_timestamp": pa.array([t for _, _, _, t in letters], pa.timestamp("us", tz="UTC")),
            "error": [f"value is not JSON (offset {o})" for _, _, o, _ in letters],
            "raw_key": pa.array([b"k"] * len(letters), pa.binary()),
            "raw_value": pa.array([b"not json"] * len(letters), pa.binary()),
            "topic": [TOPIC] * len(letters),
        }
    )
    deltalake.write_deltalake(str(path), data, mode="append", partition_by=["window_start"])


def test_a_table_without_dead_letters_counts_none(tmp_path: Path) -> None:
    counts = count_dead_letters(read_dead_letters(str(tmp_path / "dead_letters")), {})
    assert (counts.total, counts.examined, counts.worst_partition, counts.sample) == (0, 0, 0, [])


def test_examined_dead_letters_stop_counting_and_new_ones_count(tmp_path: Path) -> None:
    path, ledger, key = tmp_path / "dead_letters", Ledger(str(tmp_path)), f"shop.{TOPIC}"
    _write(path, [("2026-11-27", 0, 5, T0), ("2026-11-28", 0, 7, T0), ("2026-11-28", 1, 3, T0)])
    before = count_dead_letters(read_dead_letters(str(path)), ledger.dead_letters_examined(key))
    assert (before.total, before.examined, before.unexamined_by_partition) == (3, 0, {"2026-11-27": 1, "2026-11-28": 2})
    assert before.worst_partition == 2
    assert before.sample[0] == "partition 0 offset 5 (2026-11-27): value is not JSON (offset 5)"

    # examined: every dead letter present now is covered, each Kafka partition up to its highest offset
    marked_at = T0 + timedelta(minutes=5)
    marks = marks_for_present(read_dead_letters(str(path)), marked_at)
    assert marks == [ExaminedMark(TOPIC, 0, 7, marked_at), ExaminedMark(TOPIC, 1, 3, marked_at)]
    ledger.mark_dead_letters_examined(key, marks)
    after = count_dead_letters(read_dead_letters(str(path)), ledger.dead_letters_examined(key))
    assert (after.total, after.examined, after.worst_partition, after.sample) == (3, 3, 0, [])

    # a later dead letter counts: a higher offset, and a low offset Kafka stamped after the
    # mark (the topic deleted and created again starts its offsets over)
    later = marked_at + timedelta(seconds=1)
    _write(path, [("2026-11-28", 0, 9, later), ("2026-11-28", 1, 2, later)])
    new = count_dead_letters(read_dead_letters(str(path)), ledger.dead_letters_examined(key))
    assert (new.total, new.examined, new.unexamined_by_partition) == (5, 3, {"2026-11-28": 2})
    assert [s.split(" (")[0] for s in new.sample] == ["partition 0 offset 9", "partition 1 offset 2"]


def test_a_later_examination_replaces_an_earlier_one() -> None:
    first, second = ExaminedMark(TOPIC, 0, 7, T0), ExaminedMark(TOPIC, 0, 12, T0 + timedelta(hours=1))
    other = ExaminedMark(TOPIC, 1, 3, T0)
    assert latest_marks([second, other, first]) == {(TOPIC, 0): second, (TOPIC, 1): other}
