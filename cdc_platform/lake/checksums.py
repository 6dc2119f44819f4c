"""Hadoop's checksum files beside a local table's Delta log, kept true when delta-rs
writes the log too.

Spark writes a local table through Hadoop's checksummed filesystem, which keeps a
``.<name>.crc`` beside each file and verifies it on every read. The platform's tables are
written by both engines (Spark's jobs and MERGE; the driver's appends and merges by
delta-rs), and both write checkpoints. ``_last_checkpoint`` is the one log file that is
rewritten in place: delta-rs rewrites it and leaves Spark's ``._last_checkpoint.crc`` as it
was. Every Spark that then loaded the table afresh (the apply's start, each check run, a
table's log evicted from Delta's cache) failed the checksum three times a second apart,
logged the checkpoint as corrupted and listed the log instead.

Reading through Hadoop's raw local filesystem (``fs.file.impl``) would skip every check,
but Hadoop's own ``FileSystem.getLocal`` casts that filesystem to the checksummed one, and
S3A's upload buffers go through it: a Spark writing to an object store then fails.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

LAST_CHECKPOINT = "_last_checkpoint"
HEADER = b"crc\x00"


def drop_stale_checkpoint_checksum(table_path: str) -> bool:
    """After delta-rs committed to the table at ``table_path``: Spark's checksum of
    ``_last_checkpoint``, deleted when it no longer matches the file (Spark verifies no
    checksum it does not find, and writes a new one with its next checkpoint). Whether it
    deleted one. Object stores keep no checksum files."""
    local = _local_path(table_path)
    if local is None:
        return False
    log = local / "_delta_log"
    sidecar = log / f".{LAST_CHECKPOINT}.crc"
    try:
        kept, data = sidecar.read_bytes(), (log / LAST_CHECKPOINT).read_bytes()
    except FileNotFoundError:
        return False
    if _matches(kept, data):
        return False
    sidecar.unlink(missing_ok=True)
    return True


def hadoop_checksum(data: bytes, bytes_per_checksum: int = 512) -> bytes:
    """The ``.crc`` file Hadoop's checksummed filesystem writes for ``data``: a header, the
    chunk size, then a CRC-32 of each chunk."""
    chunks = (data[i : i + bytes_per_checksum] for i in range(0, len(data), bytes_per_checksum))
    return HEADER + struct.pack(">i", bytes_per_checksum) + b"".join(struct.pack(">I", zlib.crc32(c)) for c in chunks)


def _matches(kept: bytes, data: bytes) -> bool:
    if len(kept) < len(HEADER) + 4 or not kept.startswith(HEADER):
        return False
    (bytes_per_checksum,) = struct.unpack(">i", kept[len(HEADER) : len(HEADER) + 4])
    return bytes_per_checksum > 0 and hadoop_checksum(data, bytes_per_checksum) == kept


def _local_path(table_path: str) -> Path | None:
    if table_path.startswith("file://"):
        return Path(table_path.removeprefix("file://"))
    return None if "://" in table_path else Path(table_path)
