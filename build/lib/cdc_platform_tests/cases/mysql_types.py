"""One row per MariaDB type: the column's DDL, a SQL literal, and the value the lake must
hold (as Spark collects it) — through the snapshot and through polling + changelog alike."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

# (column, MariaDB type, SQL literal, lake value, lake type)
MYSQL_TYPE_CASES: list[tuple[str, str, str, Any, str]] = [
    ("c_bool", "BOOLEAN", "TRUE", True, "boolean"),
    ("c_tinyint", "TINYINT", "-128", -128, "smallint"),
    ("c_tinyint_u", "TINYINT UNSIGNED", "255", 255, "smallint"),
    ("c_smallint", "SMALLINT", "-32768", -32768, "smallint"),
    ("c_smallint_u", "SMALLINT UNSIGNED", "65535", 65535, "int"),
    ("c_mediumint", "MEDIUMINT", "-8388608", -8388608, "int"),
    ("c_int", "INT", "-2147483648", -2147483648, "int"),
    ("c_int_u", "INT UNSIGNED", "4294967295", 4294967295, "bigint"),
    ("c_bigint", "BIGINT", "-9223372036854775808", -9223372036854775808, "bigint"),
    ("c_bigint_u", "BIGINT UNSIGNED", "18446744073709551615", Decimal("18446744073709551615"), "decimal(20,0)"),
    ("c_decimal", "DECIMAL(12,2)", "-1234567890.12", Decimal("-1234567890.12"), "decimal(12,2)"),
    (
        "c_decimal_wide",
        "DECIMAL(50,10)",
        "1234567890123456789012345678901234567890.0123456789",
        "1234567890123456789012345678901234567890.0123456789",
        "string",
    ),
    ("c_float", "FLOAT", "1.5", 1.5, "float"),
    ("c_double", "DOUBLE", "3.141592653589793", 3.141592653589793, "double"),
    ("c_date", "DATE", "'2024-02-29'", date(2024, 2, 29), "date"),
    # a wall-clock value: no zone in the source, none in the lake
    (
        "c_datetime",
        "DATETIME(6)",
        "'2024-02-29 23:59:59.123456'",
        datetime(2024, 2, 29, 23, 59, 59, 123456),
        "timestamp_ntz",
    ),
    # an instant: written in a UTC session, read back as that UTC instant
    (
        "c_timestamp",
        "TIMESTAMP(6) NULL",
        "'2024-02-29 23:59:59.654321'",
        datetime(2024, 2, 29, 23, 59, 59, 654321),
        "timestamp",
    ),
    ("c_time", "TIME(3)", "'-838:59:59.000'", "-838:59:59.000", "string"),
    ("c_year", "YEAR", "2024", 2024, "smallint"),
    ("c_char", "CHAR(3)", "'ab'", "ab", "string"),
    ("c_varchar", "VARCHAR(20)", "'héllo ✓'", "héllo ✓", "string"),
    ("c_text", "TEXT", "'multi\\nline'", "multi\nline", "string"),
    ("c_enum", "ENUM('a','b')", "'b'", "b", "string"),
    ("c_set", "SET('x','y')", "'x,y'", "x,y", "string"),
    ("c_json", "JSON", "'{\"a\": [1, 2]}'", '{"a": [1, 2]}', "string"),
    ("c_varbinary", "VARBINARY(8)", "X'00FF10'", bytes([0, 255, 16]), "binary"),
    ("c_blob", "BLOB", "X'DEADBEEF'", bytes.fromhex("deadbeef"), "binary"),
    ("c_bit", "BIT(8)", "b'10100101'", 165, "bigint"),
    ("c_uuid", "UUID", "'123e4567-e89b-12d3-a456-426614174000'", "123e4567-e89b-12d3-a456-426614174000", "string"),
]


def type_cases_ddl(table: str = "type_cases") -> str:
    columns = ",\n  ".join(f"{name} {ddl}" for name, ddl, *_ in MYSQL_TYPE_CASES)
    return (
        f"CREATE TABLE {table} (\n  id BIGINT AUTO_INCREMENT PRIMARY KEY,\n  case_name VARCHAR(40) NOT NULL,\n  "
        f"{columns},\n  updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)\n)"
    )


# Values at the edges, one row per case in the same table: (case, column, SQL literal, lake value)
MYSQL_EDGE_CASES: list[tuple[str, str, str, Any]] = [
    ("date_first", "c_date", "'1000-01-01'", date(1000, 1, 1)),
    ("date_gap", "c_date", "'1582-10-10'", date(1582, 10, 10)),  # no Julian calendar on the way
    ("date_last", "c_date", "'9999-12-31'", date(9999, 12, 31)),
    ("datetime_year_1", "c_datetime", "'0001-01-01 00:00:00'", datetime(1, 1, 1)),
    ("datetime_gap", "c_datetime", "'1582-10-10 12:34:56.789'", datetime(1582, 10, 10, 12, 34, 56, 789000)),
    ("datetime_last", "c_datetime", "'9999-12-31 23:59:59.999999'", datetime(9999, 12, 31, 23, 59, 59, 999999)),
    ("timestamp_first", "c_timestamp", "'1970-01-01 00:00:01'", datetime(1970, 1, 1, 0, 0, 1)),
    ("timestamp_last", "c_timestamp", "'2038-01-19 03:14:07.999999'", datetime(2038, 1, 19, 3, 14, 7, 999999)),
    ("time_last", "c_time", "'838:59:59.999'", "838:59:59.999"),
    ("double_largest", "c_double", "1.7976931348623157e308", 1.7976931348623157e308),
    ("double_denormal", "c_double", "4.9e-324", 5e-324),
    ("decimal_wide_lowest", "c_decimal_wide", "-" + "9" * 40 + "." + "9" * 10, "-" + "9" * 40 + "." + "9" * 10),
    ("text_escapes", "c_text", "'tab\\there \\\\ back \"q\" ''s ✓ \\r\\n'", 'tab\there \\ back "q" \'s ✓ \r\n'),
    ("text_empty", "c_varchar", "''", ""),
    ("json_duplicate_keys", "c_json", '\'{"a": 1, "a": 2}\'', '{"a": 1, "a": 2}'),
    ("year_first", "c_year", "1901", 1901),
    ("year_last", "c_year", "2155", 2155),
    ("bit_all_ones", "c_bit", "b'11111111'", 255),
    ("bigint_u_zero", "c_bigint_u", "0", Decimal(0)),
]
