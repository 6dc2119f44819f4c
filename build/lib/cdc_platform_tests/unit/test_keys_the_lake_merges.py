"""A key column whose lake value stands for two source keys is refused when the table is
described (capture's start, the poller's, every snapshot and sensor), not found later as
a row current silently lacks."""

from __future__ import annotations

import pytest

from cdc_platform.envelope.pgtypes import PgType, builtin_type
from cdc_platform.model.errors import FatalError, SourceTableError
from cdc_platform.model.tables import LakeColumn, SourceColumn, SourceTable, TableSchema
from cdc_platform.sources.mysql.catalog import MappedColumn, map_column, polled_key
from cdc_platform.sources.postgres.catalog import key_columns_the_lake_merges

TIMETZ_OID, INT4_OID = 1266, 23


def _pg_schema(columns: dict[str, PgType], key: tuple[str, ...]) -> TableSchema:
    return TableSchema(tuple(LakeColumn(name, pgtype) for name, pgtype in columns.items()), key)


def _builtin(oid: int) -> PgType:
    pgtype = builtin_type(oid)
    assert pgtype is not None
    return pgtype


@pytest.mark.parametrize(
    ("key_type", "merged"),
    [
        (_builtin(TIMETZ_OID), True),
        (PgType(90001, "clock", "timetz"), True),  # a domain over timetz behaves as timetz
        (PgType(90002, "_timetz", "array", element=_builtin(TIMETZ_OID)), True),
        (_builtin(1083), False),  # time without zone: kept as it is
        (_builtin(1184), False),  # timestamptz: an instant, one to one
        (_builtin(INT4_OID), False),
        (PgType(90003, "_int4", "array", element=_builtin(INT4_OID)), False),
    ],
    ids=["timetz", "domain over timetz", "timetz[]", "time", "timestamptz", "int4", "int4[]"],
)
def test_a_postgres_key_column_kept_as_its_utc_time_is_one_the_lake_merges(key_type: PgType, merged: bool) -> None:
    schema = _pg_schema({"at": key_type, "n": _builtin(INT4_OID)}, ("at", "n"))
    assert ("at" in key_columns_the_lake_merges(schema)) is merged


def test_a_timetz_outside_the_key_is_not_refused() -> None:
    schema = _pg_schema({"id": _builtin(INT4_OID), "at": _builtin(TIMETZ_OID)}, ("id",))
    assert key_columns_the_lake_merges(schema) == {}


def _mariadb_table(column_type: str) -> tuple[SourceTable, list[MappedColumn]]:
    data_type = column_type.split("(", maxsplit=1)[0]
    mapped = [map_column("flag", data_type, column_type, 3, 0), map_column("n", "int", "int(11)", 10, 0)]
    columns = tuple(
        SourceColumn(m.name, m.source_type, False, False, i, m.pg_oid, m.typmod) for i, m in enumerate(mapped, 1)
    )
    return SourceTable("crm", "flags", columns, ("flag",), "full", 2), mapped


def test_a_mariadb_tinyint1_key_is_refused_naming_the_column_and_the_fix() -> None:
    """TINYINT(1) is read as a boolean: keys 1 and 2 are both true to the lake."""
    described, mapped = _mariadb_table("tinyint(1)")
    with pytest.raises(SourceTableError) as raised:
        polled_key(described, mapped, None, "tables[crm.shop.flags].primary_key")
    message = str(raised.value)
    assert isinstance(raised.value, FatalError)  # retrying cannot help: the key must change
    assert "crm.flags cannot be keyed on flag" in message
    assert "1 and 2" in message and "TINYINT(4)" in message


@pytest.mark.parametrize("column_type", ["tinyint(4)", "tinyint(3) unsigned", "int(11)"])
def test_a_mariadb_integer_key_of_another_width_is_kept(column_type: str) -> None:
    described, mapped = _mariadb_table(column_type)
    assert polled_key(described, mapped, None, "tables[crm.shop.flags].primary_key") == ("flag",)
