"""A configured table's description from its source, whatever the source kind.

Changelog decoding, the schema check and the UI need the columns in the platform's type
terms (``PgType``): PostgreSQL's catalog gives them directly, a polled (jdbc) source's
columns are mapped by ``mysql_catalog``."""

from __future__ import annotations

import psycopg

from cdc_platform.capture.jdbc import connect_mysql
from cdc_platform.capture.mysql_catalog import describe_mysql_table
from cdc_platform.capture.pg_catalog import SourceTable, describe_table, resolve_pg_types
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.envelope.pgtypes import PgType, builtin_type


def describe_source(config: PlatformConfig, table: TableConfig) -> tuple[SourceTable, dict[int, PgType]]:
    """(the table, type oid -> PgType for its columns)."""
    if config.is_polled(table):
        conn = connect_mysql(config.jdbc(table.source), table.source, "catalog")
        try:
            described, _ = describe_mysql_table(conn, table.schema_name, table.table_name)
        finally:
            conn.close()
        types = {}
        for c in described.columns:
            pgtype = builtin_type(c.type_oid)
            assert pgtype is not None  # the mapping only lands on built-in types
            types[c.type_oid] = pgtype
        return described, types
    conninfo = config.postgres(table.source).conninfo(table.source, "cdc_platform_catalog")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        described = describe_table(conn, table.schema_name, table.table_name)
        return described, resolve_pg_types(conn, [c.type_oid for c in described.columns])
