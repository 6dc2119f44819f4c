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
        return os.path.isdir(os.path.join(path.removeprefix("file://").removeprefix("file:"), "_delta_log"))
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(path))


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
