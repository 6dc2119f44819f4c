"""A source table's shape, in the platform's type terms (pure).

* ``SourceTable`` / ``SourceColumn`` — what a source's catalog says: names, the source's
  own type spelling, nullability, defaults, key, replica identity, size estimate.
* ``TableSchema`` — the *resolved* schema the lake works with: per column the
  PostgreSQL-based type (``PgType``; polled sources are mapped onto it), typmod, array
  dimensions; the key columns; the type names schema compatibility compares. It is
  recorded in the ledger with each generation (and each compatible change), so the lake
  side decodes Kafka records without asking the source.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from cdc_platform.envelope.pgtypes import PgType
from cdc_platform.model.errors import SourceTableError
from cdc_platform.model.schemas import ColumnVersion, SchemaVersion


@dataclass(frozen=True)
class SourceColumn:
    name: str
    type_name: str  # the source's spelling: format_type() for PostgreSQL, COLUMN_TYPE for MariaDB
    nullable: bool
    has_default: bool
    ordinal: int
    type_oid: int = 0
    type_modifier: int = -1
    dims: int = 1  # declared array dimensions (integer[][] -> 2)


@dataclass(frozen=True)
class SourceTable:
    schema: str
    name: str
    columns: tuple[SourceColumn, ...]
    primary_key: tuple[str, ...]  # empty when the table has none
    replica_identity: str  # default | full | index | nothing (polled tables: full)
    estimated_rows: int

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def sql_name(self) -> str:
        """The name as SQL needs it in a suggested fix ("Order Items" stays quoted)."""
        return ".".join('"' + part.replace('"', '""') + '"' for part in (self.schema, self.name))

    def schema_hash(self) -> str:
        """Stable hash of the column list (names, types, nullability) and key."""
        payload = json.dumps(
            {
                "columns": [(c.name, c.type_name, c.nullable) for c in self.columns],
                "primary_key": list(self.primary_key),
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def resolve_key(source_table: SourceTable, configured: list[str] | None, config_field: str) -> tuple[str, ...]:
    """The columns that key the table's events.

    The table's primary key, unless the config names one. A table without a primary key
    is refused unless the config names a key, and then it needs REPLICA IDENTITY FULL so
    updates and deletes carry the whole old row.
    """
    names = {c.name for c in source_table.columns}
    if configured:
        unknown = [c for c in configured if c not in names]
        if unknown:
            raise SourceTableError(
                f"{config_field} names column(s) {unknown} that {source_table.qualified} does not have "
                f"(columns: {', '.join(sorted(names))})"
            )
        if source_table.primary_key and tuple(configured) != source_table.primary_key:
            raise SourceTableError(
                f"{config_field} is {configured} but {source_table.qualified} has primary key "
                f"{list(source_table.primary_key)}; remove primary_key from the config or make them equal"
            )
        if not source_table.primary_key and source_table.replica_identity != "full":
            raise SourceTableError(
                f"{source_table.qualified} has no primary key, so a configured key needs whole old rows: "
                f"run ALTER TABLE {source_table.sql_name} REPLICA IDENTITY FULL"
            )
        return tuple(configured)
    if not source_table.primary_key:
        raise SourceTableError(
            f"{source_table.qualified} has no primary key; add one, or name key columns in "
            f"{config_field} (and ALTER TABLE {source_table.sql_name} REPLICA IDENTITY FULL)"
        )
    return source_table.primary_key


def refuse_key_the_lake_merges(source_table: SourceTable, merged: dict[str, str], fix: str) -> None:
    """Refuse a key with a column whose lake value stands for more than one source value
    (``merged``: column -> how). Current holds one row per lake key, so two source rows
    with such keys would become one and every check comparing by key would see them as
    one: the lake would miss rows without a failing check. Fatal, with ``fix``."""
    if not merged:
        return
    how = "; ".join(f"{column}: {why}" for column, why in merged.items())
    raise SourceTableError(
        f"{source_table.qualified} cannot be keyed on {', '.join(merged)}: the lake writes two different keys "
        f"alike ({how}), so current would keep one row for both; {fix}"
    )


@dataclass(frozen=True)
class LakeColumn:
    """One column as the lake decodes and stores it."""

    name: str
    pgtype: PgType
    typmod: int = -1
    dims: int = 1
    nullable: bool = True
    has_default: bool = False
    compat_type: str = ""  # the type name schema compatibility compares (PostgreSQL spelling)


@dataclass(frozen=True)
class TableSchema:
    columns: tuple[LakeColumn, ...]
    key: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> LakeColumn | None:
        return next((c for c in self.columns if c.name == name), None)

    def version(self) -> SchemaVersion:
        """What schema compatibility compares: names, type names, nullability, defaults, key."""
        return SchemaVersion(
            tuple(ColumnVersion(c.name, c.compat_type, c.nullable, c.has_default) for c in self.columns), self.key
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "key": list(self.key),
                "columns": [{**asdict(c), "pgtype": pgtype_to_dict(c.pgtype)} for c in self.columns],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> TableSchema:
        data: dict[str, Any] = json.loads(text)
        columns = tuple(LakeColumn(**{**c, "pgtype": pgtype_from_dict(c["pgtype"])}) for c in data["columns"])
        return cls(columns, tuple(data["key"]))


def pgtype_to_dict(pgtype: PgType) -> dict[str, Any]:
    return {
        "oid": pgtype.oid,
        "name": pgtype.name,
        "kind": pgtype.kind,
        "element": pgtype_to_dict(pgtype.element) if pgtype.element else None,
        "enum_values": list(pgtype.enum_values),
    }


def pgtype_from_dict(data: dict[str, Any]) -> PgType:
    element = pgtype_from_dict(data["element"]) if data.get("element") else None
    return PgType(int(data["oid"]), str(data["name"]), str(data["kind"]), element, tuple(data.get("enum_values", ())))
