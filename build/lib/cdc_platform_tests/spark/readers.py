"""Lake tables read as a user of another engine would read them (not Spark): delta-rs and
DuckDB. The lake-files and edge-values tests compare what they read with Spark."""

from __future__ import annotations

from typing import Any


def delta_rs(path: str) -> Any:
    """A pyarrow table through delta-rs: ``to_pyarrow_table``, or for a table with deletion
    vectors (current), which that reader refuses, delta-rs' own query engine (DataFusion)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(path)
    if "deletionVectors" not in (table.protocol().reader_features or []):
        return table.to_pyarrow_table()
    return pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())


def duckdb_table(path: str) -> Any:
    """A pyarrow table through DuckDB's delta extension (delta-kernel: deletion vectors too)."""
    import duckdb
    from duckdb_extensions import import_extension

    import_extension("delta")
    with duckdb.connect() as db:
        db.execute("LOAD delta")
        return db.execute("SELECT * FROM delta_scan(?)", [path]).arrow().read_all()
