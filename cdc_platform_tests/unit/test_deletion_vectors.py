"""Deletion-vector files a table no longer uses (``lake.deletion_vectors``): the Delta
protocol's naming, and which files a log written by hand (JSON commits, a classic
checkpoint) keeps on disk. No services; ``spark/test_apply.py`` runs it on Spark's own MERGEs."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_platform.lake.deletion_vectors import Z85_ALPHABET, UnreadLog, delete_replaced_vectors, vector_file

HOUR = 3600.0


def _z85(raw: bytes) -> str:
    out = ""
    for start in range(0, len(raw), 4):
        number, chars = int.from_bytes(raw[start : start + 4], "big"), ""
        for _ in range(5):
            number, digit = divmod(number, 85)
            chars = Z85_ALPHABET[digit] + chars
        out += chars
    return out


def _vector(name: str) -> dict[str, Any]:
    """A descriptor for the vector file ``deletion_vector_<uuid of name>.bin``."""
    return {"storageType": "u", "pathOrInlineDv": _z85(_uuid(name).bytes), "offset": 1, "sizeInBytes": 34,
            "cardinality": 1}  # fmt: skip


def _uuid(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, name)


def _file(name: str) -> str:
    return f"deletion_vector_{_uuid(name)}.bin"


def _add(path: str, vector: str | None = None) -> dict[str, Any]:
    return {"add": {"path": path, "deletionVector": _vector(vector) if vector else None}}


def _remove(path: str, at: float, vector: str | None = None) -> dict[str, Any]:
    return {
        "remove": {
            "path": path,
            "deletionTimestamp": int(at * 1000),
            "deletionVector": _vector(vector) if vector else None,
        }
    }


def _commit(table: Path, version: int, *actions: dict[str, Any]) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def _vector_files(table: Path, names: str, age_s: float, now: float) -> None:
    for name in names:
        path = table / _file(name)
        path.write_bytes(b"\x01vector")
        os.utime(path, (now - age_s, now - age_s))


def _history(table: Path, now: float) -> None:
    """f1 and f2 share vector A (one MERGE wrote both), then f1's is replaced by B 30 h ago,
    then 1 h ago f2's by C and f1's by D. E is a vector file no commit names."""
    _commit(table, 0, _add("f1"), _add("f2"))
    _commit(table, 1, _remove("f1", now - 48 * HOUR), _remove("f2", now - 48 * HOUR), _add("f1", "A"), _add("f2", "A"))
    _commit(table, 2, _remove("f1", now - 30 * HOUR, "A"), _add("f1", "B"))
    _commit(table, 3, _remove("f2", now - HOUR, "A"), _add("f2", "C"), _remove("f1", now - HOUR, "B"), _add("f1", "D"))
    _vector_files(table, "ABCDE", 48 * HOUR, now)


def _left(table: Path) -> set[str]:
    return {p.name for p in table.glob("deletion_vector_*.bin")}


def test_a_vector_is_named_as_the_delta_protocol_says() -> None:
    # the protocol's own example (PROTOCOL.md, "Deletion Vector Descriptor Schema")
    example = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4, "sizeInBytes": 40}
    assert vector_file(example) == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert vector_file({"storageType": "u", "pathOrInlineDv": "^-aqEH.-t@S}K{vb[*k^"}) == (
        "deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    assert (
        vector_file({"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"})
        is None
    )
    with pytest.raises(UnreadLog, match="'p'"):
        vector_file({"storageType": "p", "pathOrInlineDv": "s3://bucket/table/deletion_vector_x.bin"})


def test_replaced_vectors_older_than_the_retention_go_and_the_others_stay(tmp_path: Path) -> None:
    now = time.time()
    _history(tmp_path, now)
    # B was replaced 1 h ago: within 24 h, a reader of version 2 still needs it; A is still
    # f2's until 1 h ago; C and D are live; E, named by no commit, is older than 24 h
    assert delete_replaced_vectors(str(tmp_path), 24, now=now) == [_file("E")]
    assert _left(tmp_path) == {_file(n) for n in "ABCD"}
    # two hours later with a retention of one hour, A and B (replaced 1 h before) go too
    assert sorted(delete_replaced_vectors(str(tmp_path), 1, now=now + 2 * HOUR)) == sorted([_file("A"), _file("B")])
    assert _left(tmp_path) == {_file("C"), _file("D")}


def test_a_vector_younger_than_the_retention_stays_though_no_commit_names_it(tmp_path: Path) -> None:
    now = time.time()
    _history(tmp_path, now)
    _vector_files(tmp_path, "F", 60, now)  # a commit in flight may have written it
    assert len(delete_replaced_vectors(str(tmp_path), 0.5, now=now)) == 3  # A and B (replaced 1 h ago), E
    assert _left(tmp_path) == {_file("C"), _file("D"), _file("F")}


def test_a_checkpoint_s_files_and_tombstones_are_read(tmp_path: Path) -> None:
    """The log's JSON up to the checkpoint is gone (log cleanup), and the one commit after it
    adds f3 with G. f1's B and f2's A are live only in the checkpoint's files, and A is also
    in its tombstones: they stay, with G. C, D and E, which no version left names, go."""
    now = time.time()
    _history(tmp_path, now)
    vector = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()), ("offset", pa.int32()),
                        ("sizeInBytes", pa.int32()), ("cardinality", pa.int64())])  # fmt: skip
    add = pa.struct([("path", pa.string()), ("deletionVector", vector)])
    remove = pa.struct([("path", pa.string()), ("deletionTimestamp", pa.int64()), ("deletionVector", vector)])
    rows = [_add("f1", "B"), _add("f2", "A"), _remove("f1", now - 30 * HOUR, "A")]
    checkpoint = pa.table(
        {
            "add": pa.array([r.get("add") for r in rows], add),
            "remove": pa.array([r.get("remove") for r in rows], remove),
        }
    )
    pq.write_table(checkpoint, tmp_path / "_delta_log" / f"{2:020d}.checkpoint.parquet")
    _commit(tmp_path, 3, _add("f3", "G"))  # after the checkpoint: f2 keeps A, f1 keeps B
    for version in range(3):
        (tmp_path / "_delta_log" / f"{version:020d}.json").unlink()
    _vector_files(tmp_path, "G", 48 * HOUR, now)
    deleted = delete_replaced_vectors(str(tmp_path), 24, now=now)
    assert sorted(deleted) == sorted(_file(n) for n in "CDE")  # named by no version left in the log
    assert _left(tmp_path) == {_file(n) for n in "ABG"}


@pytest.mark.parametrize("break_log", ["missing commit", "v2 checkpoint"])
def test_a_log_it_does_not_read_deletes_nothing(tmp_path: Path, break_log: str) -> None:
    now = time.time()
    _history(tmp_path, now)
    if break_log == "missing commit":
        (tmp_path / "_delta_log" / f"{2:020d}.json").unlink()
    else:
        (tmp_path / "_delta_log" / f"{3:020d}.checkpoint.{uuid.uuid4()}.json").write_text("{}\n")
    assert delete_replaced_vectors(str(tmp_path), 0, now=now + HOUR) == []
    assert _left(tmp_path) == {_file(n) for n in "ABCDE"}


def test_a_file_uri_names_the_local_table(tmp_path: Path) -> None:
    now = time.time()
    _history(tmp_path, now)
    assert delete_replaced_vectors(f"file://{tmp_path}", 24, now=now) == [_file("E")]
    assert _left(tmp_path) == {_file(n) for n in "ABCD"}
