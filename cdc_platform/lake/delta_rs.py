"""Small Delta tables read without Spark: delta-rs and its own engine (DataFusion).

The ledger and the dead-letter count read this way, so a CLI command or a check answers in
a second with no JVM.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa


def open_table(path: str) -> Any | None:
    """The Delta table at ``path``, or None when it has never been written."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path)
    except TableNotFoundError:
        return None


def table_exists(path: str) -> bool:
    """Whether a Delta table was written at ``path``: a local directory's ``_delta_log``, or on
    object storage what delta-rs finds there (the store as ``lake.s3`` configured it)."""
    if "://" not in path or path.startswith("file:"):
        log = os.path.join(path.removeprefix("file://").removeprefix("file:"), "_delta_log")
        # a commit, not just the directory: a first write that died before its commit left no table
        return os.path.isdir(log) and any(_is_commit(name) for name in os.listdir(log))
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(path))


def commit_exists(path: str, version: int) -> bool:
    """Whether the Delta table at ``path`` has version ``version``'s commit in its log: a handle
    kept at that version still names this table (a table deleted and written anew at the same
    path has no such file until it reaches the version, and then another table's)."""
    entry = f"{path.rstrip('/')}/_delta_log/{version:020d}.json"
    if "://" not in path or path.startswith("file:"):
        return os.path.exists(entry.removeprefix("file://").removeprefix("file:"))
    from pyarrow import fs as pafs

    from cdc_platform.lake.object_store import pyarrow_uri

    store, key = pafs.FileSystem.from_uri(pyarrow_uri(entry))
    return bool(store.get_file_info(key).type != pafs.FileType.NotFound)


def _is_commit(name: str) -> bool:
    """A Delta log entry that makes a version: a commit's JSON or a checkpoint."""
    return (name.endswith(".json") and name[:1].isdigit()) or ".checkpoint." in name


def read_columns(delta: Any, columns: Sequence[str]) -> pa.Table:
    """``columns`` of every row, with plain ``string`` text columns.

    Not ``to_pyarrow_table``: its pyarrow dataset keeps IO threads on delta-rs' filesystem
    handler, and a short process (a CLI command) then aborts at exit one time in two
    ("terminate called without an active exception", delta-io/delta-rs#2184).
    """
    from deltalake import QueryBuilder

    selected = ", ".join(f'"{c}"' for c in columns)
    data = pa.table(QueryBuilder().register("t", delta).execute(f"SELECT {selected} FROM t").read_all())
    # DataFusion hands back string_view columns (and a partition column as large text)
    return data.cast(pa.schema([_plain(data.schema.field(c)) for c in columns]))


def _plain(f: pa.Field) -> pa.Field:
    return f.with_type(pa.string()) if pa.types.is_string_view(f.type) or pa.types.is_large_string(f.type) else f
