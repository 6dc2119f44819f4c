"""What a MariaDB/MySQL table looks like, in the platform's (PostgreSQL-based) type terms.

The changelog, current state and the lake types are defined over PostgreSQL types
(``envelope/pgtypes.py``, ``lake/lake_types.py``). A polled table's columns are mapped
onto them once, here, so everything downstream works unchanged:

| MariaDB / MySQL | as | lake |
|---|---|---|
| tinyint(1) / bool | boolean | boolean |
| tinyint, smallint, tinyint unsigned, year | smallint | short |
| mediumint (±), int, smallint unsigned | integer | int |
| int unsigned, bigint | bigint | long |
| bigint unsigned, bit(64) | numeric(20,0) | decimal(20,0): 18446744073709551615 fits |
| bit(n < 64) | bigint | long |
| decimal(p,s) | numeric(p,s) | decimal(p,s), p ≤ 38; text beyond (MariaDB allows 65) |
| float / double | real / double precision | float / double |
| date | date | date |
| datetime | timestamp (no zone) | timestamp_ntz: a wall-clock value, none invented |
| timestamp | timestamp with time zone | timestamp (UTC instant; read in a UTC session) |
| time | text 'HH:MM:SS[.f]' | string (MariaDB's TIME spans ±838 hours) |
| json (MySQL), longtext CHECK (json_valid(c)) (MariaDB) | json | string |
| binary, varbinary, blob | bytea | binary |
| char, varchar, text, enum, set, uuid, inet, anything else | text | string (the server's text form) |

Every column is read through one SELECT expression (``select_sql``) shared by the
poller and the Spark JDBC snapshot, so both see the same text for the same value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cdc_platform.envelope.pgtypes import builtin_type
from cdc_platform.model.errors import SourceTableError
from cdc_platform.model.tables import (
    LakeColumn,
    SourceColumn,
    SourceTable,
    TableSchema,
    refuse_key_the_lake_merges,
    resolve_key,
)

# PostgreSQL type oids the mapping lands on (see envelope/pgtypes.BUILTIN_TYPES)
OID_BOOL, OID_BYTEA, OID_INT8, OID_INT2, OID_INT4, OID_TEXT, OID_JSON = 16, 17, 20, 21, 23, 25, 114
OID_FLOAT4, OID_FLOAT8, OID_DATE, OID_TIMESTAMP, OID_TIMESTAMPTZ, OID_NUMERIC = 700, 701, 1082, 1114, 1184, 1700
UNSIGNED_BIGINT_MAX = 18_446_744_073_709_551_615
DATETIME_TEXT = "%Y-%m-%d %H:%i:%s.%f"


@dataclass(frozen=True)
class MappedColumn:
    name: str
    source_type: str  # MariaDB's COLUMN_TYPE, e.g. "bigint(20) unsigned"
    pg_oid: int
    typmod: int
    select_sql: str  # the expression both the poller and the snapshot read
    decode: str  # how a reader turns that expression's value into the lake value: see decode_value


def quote_mysql(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


def map_column(name: str, data_type: str, column_type: str, precision: int | None, scale: int | None,
               is_json: bool = False) -> MappedColumn:  # fmt: skip
    """One column's mapping (pure: information_schema values in, mapping out)."""
    ident = quote_mysql(name)
    dt = data_type.lower()
    ct = column_type.lower()
    unsigned = "unsigned" in ct

    def mapped(oid: int, typmod: int = -1, sql: str | None = None, decode: str = "plain") -> MappedColumn:
        return MappedColumn(name, column_type, oid, typmod, sql or ident, decode)

    if dt in ("tinyint", "bool", "boolean") and (re.match(r"^tinyint\(1\)", ct) or dt != "tinyint"):
        return mapped(OID_BOOL, sql=f"({ident} <> 0)", decode="bool")
    if dt == "year":  # JDBC would read it as a date
        return mapped(OID_INT2, sql=f"CAST({ident} AS UNSIGNED)")
    if dt == "tinyint" or (dt == "smallint" and not unsigned):
        return mapped(OID_INT2)
    if dt in ("mediumint", "smallint") or (dt == "int" and not unsigned) or (dt == "integer" and not unsigned):
        return mapped(OID_INT4)
    if dt in ("int", "integer") or (dt == "bigint" and not unsigned):
        return mapped(OID_INT8)
    if dt == "bigint" or (dt == "bit" and (precision or 1) >= 64):
        # beyond a signed long: exact digits as text, a decimal(20,0) in the lake
        return mapped(OID_NUMERIC, numeric_typmod(20, 0), f"CAST({ident} + 0 AS CHAR)", "text")
    if dt == "bit":
        return mapped(OID_INT8, sql=f"CAST({ident} + 0 AS UNSIGNED)")
    if dt in ("decimal", "numeric", "dec", "fixed"):
        p, s = precision or 10, scale or 0
        if p > 38:  # beyond Spark's decimals: the text, converted exactly
            return mapped(OID_NUMERIC, numeric_typmod(p, s), f"CAST({ident} AS CHAR)", "text")
        return mapped(OID_NUMERIC, numeric_typmod(p, s), decode="decimal")
    if dt == "float":
        return mapped(OID_FLOAT4)
    if dt in ("double", "real", "double precision"):
        return mapped(OID_FLOAT8)
    if dt == "date":
        return mapped(OID_DATE, sql=f"DATE_FORMAT({ident}, '%Y-%m-%d')", decode="text")
    if dt == "datetime":
        return mapped(OID_TIMESTAMP, sql=f"DATE_FORMAT({ident}, '{DATETIME_TEXT}')", decode="timestamp")
    if dt == "timestamp":
        return mapped(OID_TIMESTAMPTZ, sql=f"DATE_FORMAT({ident}, '{DATETIME_TEXT}')", decode="timestamptz")
    if dt == "json" or is_json:
        return mapped(OID_JSON, sql=f"CAST({ident} AS CHAR)", decode="text")
    if dt in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return mapped(OID_BYTEA, sql=f"HEX({ident})", decode="hex")
    if dt in ("varchar", "tinytext", "text", "mediumtext", "longtext"):
        return mapped(OID_TEXT)
    # char/enum/set: as text, so JDBC readers do not pad them to a declared width (MariaDB
    # returns CHAR values without trailing spaces)
    # time, uuid, inet4/6, geometry…: the server's text form
    return mapped(OID_TEXT, sql=f"CAST({ident} AS CHAR)", decode="text")


NUMERIC_OIDS = {OID_BOOL, OID_INT2, OID_INT4, OID_INT8, OID_NUMERIC, OID_FLOAT4, OID_FLOAT8}


def soft_deleted(value: Any, column: MappedColumn) -> bool:
    """A soft-delete marker is set when non-NULL and, for numeric/boolean columns, not 0
    (``deleted_at`` timestamps and ``is_deleted`` flags alike). ``live_row_sql`` is the
    same rule in SQL, for snapshots."""
    if value is None:
        return False
    if column.pg_oid in NUMERIC_OIDS:
        return Decimal(str(value)) != 0
    return True


def live_row_sql(column: MappedColumn) -> str:
    ident = quote_mysql(column.name)
    if column.pg_oid in NUMERIC_OIDS:
        return f"({ident} IS NULL OR {ident} = 0)"
    return f"{ident} IS NULL"


_SCHEMA_NAMES = {
    OID_BOOL: "boolean", OID_INT2: "smallint", OID_INT4: "integer", OID_INT8: "bigint", OID_FLOAT4: "real",
    OID_FLOAT8: "double precision", OID_DATE: "date", OID_TIMESTAMP: "timestamp without time zone",
    OID_TIMESTAMPTZ: "timestamp with time zone", OID_BYTEA: "bytea", OID_JSON: "json", OID_TEXT: "text",
}  # fmt: skip


def schema_type_name(oid: int, typmod: int) -> str:
    """The mapped type in PostgreSQL's spelling, which the schema-compatibility rules know:
    a MariaDB change is judged by what it does to the lake (int -> bigint widens,
    varchar(20) -> varchar(40) changes nothing, bigint -> int narrows)."""
    if oid == OID_NUMERIC:
        value = typmod - 4
        return f"numeric({(value >> 16) & 0xFFFF},{value & 0xFFFF})"
    return _SCHEMA_NAMES[oid]


def pg_text(value: Any, decode: str) -> str | None:
    """A value as read through ``select_sql`` -> the PostgreSQL text form the envelope codec
    converts (``pgtypes.to_json_value``). Pure; the poller's only value conversion."""
    if value is None:
        return None
    if decode == "bool":
        return "t" if int(value) else "f"
    if isinstance(value, bytes | bytearray):
        value = value.decode()
    if decode == "hex":
        return "\\x" + str(value).lower()
    if decode == "timestamptz":
        return f"{value}+00"  # the session runs in UTC
    if decode == "decimal":
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    return str(value)


def describe_mysql_table(conn: Any, schema: str, table: str) -> tuple[SourceTable, list[MappedColumn]]:
    """The table's columns (mapped), primary key and size, from information_schema."""
    with conn.cursor() as cur:
        estimated = _estimated_rows(cur, schema, table)
        cur.execute(
            """SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, ORDINAL_POSITION,
                      COALESCE(NUMERIC_PRECISION, CASE WHEN DATA_TYPE = 'bit' THEN 0 END), NUMERIC_SCALE
               FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s
               ORDER BY ORDINAL_POSITION""",
            (schema, table),
        )
        rows = cur.fetchall()
        json_columns = _json_checked_columns(cur, schema, table)
        cur.execute(
            """SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE
               WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY'
               ORDER BY ORDINAL_POSITION""",
            (schema, table),
        )
        primary_key = tuple(str(r[0]) for r in cur.fetchall())
    mapped = [_map_row(row, json_columns) for row in rows]
    columns = tuple(_source_column(row, m) for row, m in zip(rows, mapped, strict=True))
    # every polled event carries the whole row: replica identity 'full'
    return SourceTable(schema, table, columns, primary_key, "full", estimated), mapped


def _estimated_rows(cur: Any, schema: str, table: str) -> int:
    cur.execute(
        "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
        (schema, table),
    )
    found = cur.fetchone()
    if found is None:
        raise SourceTableError(
            f"table {schema}.{table} does not exist (or the polling user cannot see it); fix the name in "
            f"the config, create the table, or GRANT SELECT ON {quote_mysql(schema)}.* TO the user"
        )
    return int(found[0] or 0)


def _map_row(row: tuple[Any, ...], json_columns: set[str]) -> MappedColumn:
    name, data_type, column_type, _nullable, _default, _ordinal, numeric_precision, scale = row
    bit = str(data_type).lower() == "bit"
    precision = _bit_width(str(column_type)) if bit else _int(numeric_precision)
    return map_column(str(name), str(data_type), str(column_type), precision, _int(scale), str(name) in json_columns)


def _source_column(row: tuple[Any, ...], m: MappedColumn) -> SourceColumn:
    name, _data_type, column_type, nullable, default, ordinal, _precision, _scale = row
    return SourceColumn(
        name=str(name),
        type_name="json" if m.pg_oid == OID_JSON else str(column_type),
        nullable=str(nullable).upper() == "YES",
        has_default=default is not None,
        ordinal=int(ordinal),
        type_oid=m.pg_oid,
        type_modifier=m.typmod,
    )


def polled_key(
    described: SourceTable, mapped: Iterable[MappedColumn], configured_key: list[str] | None, config_field: str
) -> tuple[str, ...]:
    """The table's key (``resolve_key``), refused when the lake would merge two of its
    values: a TINYINT(1) key column is read as a boolean, so 1 and 2 are both true."""
    key = resolve_key(described, configured_key, config_field)
    merged = {
        m.name: f"{m.source_type} is read as a boolean, so 1 and 2, two keys to MariaDB, are both true to the lake"
        for m in mapped
        if m.name in key and m.decode == "bool"
    }
    fix = (
        "declare the column with another display width (MODIFY it as TINYINT(4), keeping its other attributes: "
        "only TINYINT(1) is read as a boolean), or key the table on other columns"
    )
    refuse_key_the_lake_merges(described, merged, fix)
    return key


def table_schema(described: SourceTable, key: tuple[str, ...]) -> TableSchema:
    """The resolved schema: columns mapped onto PostgreSQL's types; compatibility judges a
    change by its lake type (``schema_type_name``), not by MariaDB's spelling."""
    columns = []
    for c in described.columns:
        pgtype = builtin_type(c.type_oid)
        assert pgtype is not None  # the mapping only lands on built-in types
        columns.append(
            LakeColumn(c.name, pgtype, c.type_modifier, 1, c.nullable, c.has_default,
                       schema_type_name(c.type_oid, c.type_modifier))
        )  # fmt: skip
    return TableSchema(tuple(columns), key)


def _json_checked_columns(cur: Any, schema: str, table: str) -> set[str]:
    """MariaDB's JSON is LONGTEXT with CHECK (json_valid(`c`)); find those columns."""
    try:
        cur.execute(
            """SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS
               WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s""",
            (schema, table),
        )
    except Exception:  # MySQL < 8.0.16 has no CHECK_CONSTRAINTS; its JSON is a real type
        return set()
    return json_valid_columns(str(r[0]) for r in cur.fetchall())


def json_valid_columns(clauses: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for clause in clauses:
        match = re.fullmatch(r"\s*json_valid\(`((?:[^`]|``)+)`\)\s*", clause, re.IGNORECASE)
        if match:
            found.add(match[1].replace("``", "`"))
    return found


def _bit_width(column_type: str) -> int:
    match = re.search(r"\((\d+)\)", column_type)
    return int(match[1]) if match else 1


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
