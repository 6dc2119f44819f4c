"""One case per PostgreSQL type capture must carry exactly: (column, SQL type, SQL literal).

The type round-trip test creates a table with one column per case and inserts one row
per case (only that column set), then checks that every captured value decodes to
exactly what PostgreSQL returns for it. Add a row here to cover a new type.
"""


def type_cases_ddl() -> list[str]:
    """The enum, the domain and the ``type_cases`` table (one column per case)."""
    columns = ", ".join(f"{name} {sqltype}" for name, sqltype, _ in TYPE_CASES)
    return [
        "CREATE TYPE cap_mood AS ENUM ('happy', 'so-so', 'sad')",
        "CREATE DOMAIN cap_positive AS integer CHECK (VALUE > 0)",
        f"CREATE TABLE type_cases (case_name text PRIMARY KEY, {columns})",
    ]


TYPE_CASES: list[tuple[str, str, str]] = [
    ("c_smallint", "smallint", "-32768"),
    ("c_integer", "integer", "2147483647"),
    ("c_bigint", "bigint", "-9223372036854775808"),
    ("c_real", "real", "3.4028235e38"),
    ("c_double", "double precision", "0.1"),
    ("c_numeric_fixed", "numeric(38,9)", "12345678901234567890123456789.123456789"),
    ("c_numeric_negative", "numeric(12,2)", "-0.01"),
    ("c_numeric_any", "numeric", "-123456789012345678901234567890.000000000000000000000000000001"),
    ("c_boolean", "boolean", "true"),
    ("c_text", "text", "E'h\\u00e9llo \"quoted\" \\\\ back\\nslash'"),
    ("c_varchar", "varchar(20)", "'ünïcødé ✓'"),
    ("c_char", "char(5)", "'ab'"),
    ("c_date", "date", "'2024-02-29'"),
    ("c_date_old", "date", "'0001-01-01'"),
    ("c_time", "time", "'23:59:59.999999'"),
    ("c_timetz", "time with time zone", "'10:00:00.25+05:30'"),
    ("c_timestamp", "timestamp", "'1999-12-31 23:59:59.123456'"),
    ("c_timestamptz", "timestamp with time zone", "'2024-03-10 02:30:00.5-08'"),
    ("c_timestamptz_pre_epoch", "timestamp with time zone", "'1901-12-13 20:45:52.000001+00'"),
    ("c_interval", "interval", "'1 year 2 months 3 days 04:05:06.789'"),
    ("c_interval_negative", "interval", "'-1 days -00:00:01'"),
    ("c_uuid", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"),
    ("c_json", "json", '\'{"b": 1, "a": [1, 2.50, null]}\''),
    ("c_jsonb", "jsonb", '\'{"b": 1, "a": [1, 2.50, null], "s": "✓"}\''),
    ("c_bytea", "bytea", "'\\x00ff10'::bytea"),
    ("c_text_array", "text[]", "ARRAY['a', 'b c', NULL, 'quo\"te', 'back\\slash', '']"),
    ("c_int_array", "integer[]", "ARRAY[1, NULL, 3]"),
    ("c_int_matrix", "integer[][]", "ARRAY[[1, 2], [3, 4]]"),
    ("c_numeric_array", "numeric(8,2)[]", "ARRAY[1.50, -2.25]"),
    ("c_uuid_array", "uuid[]", "ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid]"),
    ("c_enum", "cap_mood", "'so-so'"),
    ("c_enum_array", "cap_mood[]", "ARRAY['happy', 'sad']::cap_mood[]"),
    ("c_domain", "cap_positive", "42"),
    ("c_inet", "inet", "'192.168.0.1/24'"),
]
