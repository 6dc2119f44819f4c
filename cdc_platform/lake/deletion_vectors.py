"""Deletion-vector files a Delta table no longer uses, found from its log and deleted.

Spark's MERGE into current (deletion vectors on) marks a batch's replaced rows in a
deletion vector instead of rewriting the data file; the next batch that touches the same
file writes a new vector and the log records the old one as removed. delta-rs' lite VACUUM
(``lake.maintenance``) deletes only the data files the log records as removed, never a
vector, so a table Spark merges kept one more small file on disk per batch, for ever: at a
batch every few seconds, tens of thousands of files a day per table, which every listing of
the table (Spark's VACUUM, an object store's inventory) then pays for. (delta-rs' full mode
deleted the *live* vectors of such a table in 1.6.6; it is never used.)

A vector file is still needed while the table's latest version uses it, or while a version
within the retention uses it: that is, while a remove action naming it is younger than
``retain_old_files_hours``. This module reads the table's log (its newest classic checkpoint,
whose tombstones are the removes within the table's own retention, and the JSON commits
after it), keeps every vector file named so, and deletes the other ``deletion_vector_*.bin``
files of the table that are older than the retention (an older file, because a commit in
flight may have written one the log does not name yet). A log in a form it does not read
(a V2 checkpoint, a missing commit, a vector stored by absolute path) makes it delete
nothing. The files are read, listed and deleted through pyarrow's filesystems: the local
disk, or the lake's object store (``s3a://…``, with the ``AWS_*`` settings delta-rs reads,
``lake/object_store.py``), where a listing gives each object's last-modified time.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow.fs as pafs

log = logging.getLogger(__name__)

Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {char: value for value, char in enumerate(Z85_ALPHABET)}
UUID_Z85_LENGTH = 20  # 16 bytes in Z85
VECTOR_FILE_GLOB = "deletion_vector_*.bin"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CLASSIC_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTIPART_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_V2_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")


class UnreadLog(Exception):
    """The log is in a form this module does not read; nothing is deleted."""


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ's base 85), as Delta encodes a deletion vector's uuid: 5 characters, 4 bytes."""
    if len(text) % 5:
        raise ValueError(f"Z85 text must be a multiple of 5 characters long, got {len(text)}")
    out = bytearray()
    for start in range(0, len(text), 5):
        number = 0
        for char in text[start : start + 5]:
            number = number * 85 + _Z85_VALUE[char]
        out += number.to_bytes(4, "big")
    return bytes(out)


def vector_file(descriptor: Mapping[str, Any]) -> str | None:
    """The file of a deletion-vector descriptor, relative to the table (Delta protocol,
    storage type ``u``: an optional directory prefix, then the uuid in Z85); None for an
    inline vector (``i``: no file). A vector stored by absolute path (``p``) is refused."""
    storage = descriptor.get("storageType")
    if storage == "i":
        return None
    if storage != "u":
        raise UnreadLog(f"a deletion vector stored as {storage!r} (only 'u' and 'i' are read)")
    encoded = str(descriptor["pathOrInlineDv"])
    prefix, uuid_z85 = encoded[:-UUID_Z85_LENGTH], encoded[-UUID_Z85_LENGTH:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(uuid_z85))}.bin"
    return f"{prefix}/{name}" if prefix else name


@dataclass
class VectorState:
    """The log replayed for its deletion vectors: each live file entry's vector file (by the
    entry's path and vector), and when each vector file was last named by a remove."""

    live: dict[tuple[str, str], str | None] = field(default_factory=dict)
    removed_at_ms: dict[str, int] = field(default_factory=dict)

    def add(self, action: Mapping[str, Any]) -> None:
        vector = action.get("deletionVector")
        self.live[_entry(action)] = vector_file(vector) if vector else None

    def remove(self, action: Mapping[str, Any]) -> None:
        self.live.pop(_entry(action), None)
        vector = action.get("deletionVector")
        name = vector_file(vector) if vector else None
        if name is not None:
            when = int(action.get("deletionTimestamp") or 0)
            self.removed_at_ms[name] = max(when, self.removed_at_ms.get(name, 0))

    def in_use(self, removed_after_ms: int) -> set[str]:
        """Vector files the latest version uses, or that a remove younger than the cut names."""
        live = {name for name in self.live.values() if name is not None}
        return live | {name for name, when in self.removed_at_ms.items() if when > removed_after_ms}


def _entry(action: Mapping[str, Any]) -> tuple[str, str]:
    """A file entry's identity in the log: its path and its deletion vector (Delta's rule)."""
    vector = action.get("deletionVector") or {}
    return str(action["path"]), f"{vector.get('storageType')}{vector.get('pathOrInlineDv')}@{vector.get('offset')}"


def replay(actions: Iterable[Mapping[str, Any]], state: VectorState | None = None) -> VectorState:
    """``actions`` (the log's, oldest first) applied to ``state`` (a new one when None)."""
    state = state if state is not None else VectorState()
    for action in actions:
        if action.get("add"):
            state.add(action["add"])
        elif action.get("remove"):
            state.remove(action["remove"])
    return state


def read_log(table_path: str) -> VectorState:
    """The table's log replayed from its newest checkpoint (or its first commit)."""
    fs, root = table_filesystem(table_path)
    return _read_log(fs, root, list(_listing(fs, f"{root}/_delta_log")))


def _read_log(fs: pafs.FileSystem, root: str, names: list[str]) -> VectorState:
    """The log whose files ``names`` (of ``<root>/_delta_log``) are, replayed."""
    log_dir = f"{root}/_delta_log"
    commits = sorted(int(m.group(1)) for m in map(_COMMIT.match, names) if m)
    if not commits:
        raise UnreadLog("no commit in the log")
    checkpoint, parts = _newest_checkpoint(names)
    if any(int(m.group(1)) >= checkpoint for m in map(_V2_CHECKPOINT.match, names) if m):
        raise UnreadLog("a V2 checkpoint")
    state = VectorState()
    if checkpoint >= 0:
        replay(_checkpoint_actions(fs, log_dir, checkpoint, parts), state)
    wanted = list(range(checkpoint + 1, commits[-1] + 1))
    if not set(wanted) <= set(commits):
        raise UnreadLog(f"commits missing between {checkpoint + 1} and {commits[-1]}")
    for version in wanted:
        replay(_commit_actions(fs, f"{log_dir}/{version:020d}.json"), state)
    return state


def table_filesystem(table_path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding the table (the local disk, or the lake's object store) and
    the table's path in it, without a trailing slash."""
    import pyarrow.fs as pafs

    # imported here: object_store imports the config package, whose loader imports object_store
    from cdc_platform.lake.object_store import pyarrow_uri

    if "://" in table_path and not table_path.startswith("file://"):
        fs, path = pafs.FileSystem.from_uri(pyarrow_uri(table_path))
        return fs, path.rstrip("/")
    return pafs.LocalFileSystem(), str(Path(table_path.removeprefix("file://")).absolute())


def _listing(fs: pafs.FileSystem, directory: str) -> dict[str, float]:
    """The files directly in ``directory`` (names) and their modification times (seconds)."""
    import pyarrow.fs as pafs

    found: dict[str, float] = {}
    for info in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
        if info.type == pafs.FileType.File:  # a file without a time counts as new: it is kept
            found[info.base_name] = info.mtime.timestamp() if info.mtime is not None else time.time()
    return found


def _newest_checkpoint(names: list[str]) -> tuple[int, list[str]]:
    """The newest complete classic checkpoint's version and files (-1 and none without one)."""
    found: dict[int, list[str]] = {}
    for name in names:
        if m := _CLASSIC_CHECKPOINT.match(name):
            found[int(m.group(1))] = [name]
    multipart: dict[tuple[int, int], list[str]] = {}
    for name in names:
        if m := _MULTIPART_CHECKPOINT.match(name):
            multipart.setdefault((int(m.group(1)), int(m.group(3))), []).append(name)
    for (version, total), files in multipart.items():
        if len(files) == total:
            found.setdefault(version, sorted(files))
    if not found:
        return -1, []
    version = max(found)
    return version, found[version]


def _checkpoint_actions(
    fs: pafs.FileSystem, log_dir: str, version: int, parts: list[str]
) -> Iterable[Mapping[str, Any]]:
    import pyarrow.parquet as pq

    for part in parts:
        path = f"{log_dir}/{part}"
        columns = [c for c in ("add", "remove", "sidecar") if c in pq.read_schema(path, filesystem=fs).names]
        rows = pq.read_table(path, columns=columns, filesystem=fs).to_pylist()
        if any(row.get("sidecar") for row in rows):
            raise UnreadLog(f"checkpoint {version} has sidecar files")
        yield from rows


def _commit_actions(fs: pafs.FileSystem, path: str) -> Iterable[Mapping[str, Any]]:
    with fs.open_input_stream(path) as stream:
        text = stream.read().decode()
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def vector_files_on_disk(fs: pafs.FileSystem, root: str, prefixes: Iterable[str] = ()) -> dict[str, float]:
    """The table's ``deletion_vector_*.bin`` files (relative paths) and their modification times."""
    found: dict[str, float] = {}
    for prefix in {"", *prefixes}:
        directory = f"{root}/{prefix}" if prefix else root
        for name, mtime in _listing(fs, directory).items():
            if fnmatch.fnmatchcase(name, VECTOR_FILE_GLOB):
                found[f"{prefix}/{name}" if prefix else name] = mtime
    return found


def delete_replaced_vectors(table_path: str, retain_hours: float, now: float | None = None) -> list[str]:
    """Delete the table's deletion-vector files that no version within ``retain_hours`` uses
    and that are older than that; the files deleted (relative paths)."""
    import pyarrow.fs as pafs

    fs, root = table_filesystem(table_path)
    on_disk = vector_files_on_disk(fs, root)
    log_names = list(_listing(fs, f"{root}/_delta_log")) if on_disk else []
    if not log_names:
        return []  # a table without vectors at its root: Spark writes them there (no random prefixes)
    now = time.time() if now is None else now
    cut_s = now - retain_hours * 3600
    try:
        in_use = _read_log(fs, root, log_names).in_use(removed_after_ms=int(cut_s * 1000))
    except UnreadLog as exc:
        log.info("%s: replaced deletion vectors are left for Spark's VACUUM: %s", table_path, exc)
        return []
    prefixes = {name.rpartition("/")[0] for name in in_use if "/" in name}
    if prefixes:
        on_disk = vector_files_on_disk(fs, root, prefixes)
    deleted, local = [], isinstance(fs, pafs.LocalFileSystem)
    for name, mtime in sorted(on_disk.items()):
        if name in in_use or mtime >= cut_s:
            continue
        directory, _, base = f"{root}/{name}".rpartition("/")
        _delete(fs, f"{directory}/{base}")
        if local:  # Hadoop's local file system writes a checksum beside it (S3A does not)
            _delete(fs, f"{directory}/.{base}.crc")
        deleted.append(name)
    return deleted


def _delete(fs: pafs.FileSystem, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # gone already: another VACUUM, or never written
        fs.delete_file(path)
