"""Values at the edges of PostgreSQL's types: (case, column, SQL literal), one row per case.

The edge-values test creates ``edge_cases`` with one column per type below, inserts one
row per case (only its column set) and takes it through the snapshot and through
capture -> changelog -> current, then compares each case with PostgreSQL's own value
and the two paths with each other. The README's type table says what each becomes.
Values the lake refuses by design (an array of other dimensions than declared, an
instant past 294247, NaN in numeric(p,s)) are in ``REFUSED_CASES``: a dead letter in the changelog, a
refused generation in the snapshot, never a NULL.
"""

EDGE_COLUMNS: list[tuple[str, str]] = [
    ("d", "date"),
    ("ts", "timestamp"),
    ("tz", "timestamptz"),
    ("n", "numeric"),
    ("n2", "numeric(12,2)"),
    ("r", "real"),
    ("f", "double precision"),
    ("t", "time"),
    ("tt", "timetz"),
    ("x", "text"),
    ("j", "json"),
    ("m", "money"),
    ("ia", "integer[]"),
    ("im", "integer[][]"),
    ("ta", "text[]"),
    ("da", "edge_ints"),
    ("ea", "edge_mood[]"),
]


def edge_cases_ddl(table: str = "edge_cases") -> list[str]:
    columns = ", ".join(f"{name} {sqltype}" for name, sqltype in EDGE_COLUMNS)
    return [
        "CREATE TYPE edge_mood AS ENUM ('happy', 'so-so', 'sad')",
        "CREATE DOMAIN edge_ints AS integer[] CHECK (cardinality(VALUE) < 10)",
        f"CREATE TABLE {table} (case_name text PRIMARY KEY, {columns})",
    ]


EVERY_ESCAPE = "E'\\b\\f\\n\\r\\t\\x01\\x1f\\x7f \"q\" \\\\ \\u2028 \\U0001F600 '' /'"

EDGE_CASES: list[tuple[str, str, str]] = [
    # dates: BC, the 1582 gap, years 1 and 9999 and beyond, PostgreSQL's extremes, infinity
    ("date_first", "d", "'4714-11-24 BC'"),
    ("date_1_bc", "d", "'0001-12-31 BC'"),
    ("date_year_1", "d", "'0001-01-01'"),
    ("date_gap", "d", "'1582-10-10'"),
    ("date_year_9999", "d", "'9999-12-31'"),
    ("date_year_10000", "d", "'10000-01-01'"),
    ("date_last", "d", "'5874897-12-31'"),
    ("date_infinity", "d", "'infinity'"),
    ("date_minus_infinity", "d", "'-infinity'"),
    # timestamps: BC, outside 1677-2262, the last a 64-bit microsecond count holds, infinity
    ("ts_first", "ts", "'4713-01-01 00:00:00 BC'"),
    ("ts_year_1", "ts", "'0001-01-01 00:00:00'"),
    ("ts_gap", "ts", "'1582-10-10 12:34:56.789'"),
    ("ts_pre_1677", "ts", "'1600-06-15 00:00:00.000001'"),
    ("ts_year_9999", "ts", "'9999-12-31 23:59:59.999999'"),
    ("ts_year_10000", "ts", "'10000-01-01 00:00:00'"),
    ("ts_last_micro", "ts", "'294247-01-10 04:00:54.775806'"),
    ("ts_infinity", "ts", "'infinity'"),
    ("ts_minus_infinity", "ts", "'-infinity'"),
    ("tz_first", "tz", "'4713-01-01 00:00:00+00 BC'"),
    ("tz_crosses_into_bc", "tz", "'0001-01-01 03:00:00+05'"),
    ("tz_gap", "tz", "'1582-10-10 12:00:00-03:30'"),
    ("tz_year_12345", "tz", "'12345-06-07 08:09:10.5+03'"),
    ("tz_infinity", "tz", "'infinity'"),
    ("tz_minus_infinity", "tz", "'-infinity'"),
    # numerics: non-finite, -0, a thousand digits each side, the scale kept
    ("num_nan", "n", "'NaN'"),
    ("num_infinity", "n", "'Infinity'"),
    ("num_minus_infinity", "n", "'-Infinity'"),
    ("num_minus_zero", "n", "'-0'"),
    ("num_huge", "n", "'" + "9" * 1000 + "." + "9" * 1000 + "'"),
    ("num_tiny", "n", "'0." + "0" * 999 + "1'"),
    ("num_trailing_zeros", "n", "'1.500000000000000000000000000000000000000000'"),
    ("num2_minus_zero", "n2", "'-0.00'"),
    ("num2_largest", "n2", "'-9999999999.99'"),
    # floats: non-finite, signed zero, denormals, the largest
    ("real_nan", "r", "'NaN'"),
    ("real_infinity", "r", "'Infinity'"),
    ("real_minus_zero", "r", "'-0'"),
    ("real_denormal", "r", "'1.4e-45'"),
    ("real_largest", "r", "'3.4028235e38'"),
    ("double_nan", "f", "'NaN'"),
    ("double_minus_infinity", "f", "'-Infinity'"),
    ("double_minus_zero", "f", "'-0'"),
    ("double_denormal", "f", "'5e-324'"),
    ("double_largest", "f", "'1.7976931348623157e308'"),
    # times: 24:00:00, odd offsets (minutes and seconds, the largest), crossing midnight
    ("time_24", "t", "'24:00:00'"),
    ("time_last_micro", "t", "'23:59:59.999999'"),
    ("timetz_max_offset", "tt", "'00:00:00+15:59'"),
    ("timetz_min_offset", "tt", "'23:59:59.999999-15:59'"),
    ("timetz_seconds_offset", "tt", "'12:00:00+05:45:30'"),
    ("timetz_24", "tt", "'24:00:00+00'"),
    # text and json: every escape (NUL-free), duplicate keys and odd spacing kept
    ("text_escapes", "x", EVERY_ESCAPE),
    ("text_empty", "x", "''"),
    ("json_duplicate_keys", "j", '\'{"a": 1, "a": 2}\''),
    ("json_spacing", "j", '\'{ "b" :[1 , 2.50e0,"\\u00e9"] }\''),
    # money: written as numbers, read back under de_DE's lc_monetary ('1.234,56 €')
    ("money_thousands", "m", "1234.56::numeric::money"),
    ("money_smallest", "m", "'-92233720368547758.08'::numeric::money"),
    # arrays: empty, NULL elements, quoting in text arrays, domains over arrays, enum arrays
    ("array_empty", "ia", "'{}'"),
    ("array_null_elements", "ia", "'{NULL,NULL}'"),
    ("matrix_empty", "im", "'{}'"),
    ("matrix_null_element", "im", "'{{NULL,1},{2,NULL}}'"),
    ("text_array_quoting", "ta", "ARRAY['', NULL, 'NULL', 'a,b', '{}', 'back\\slash', 'quo\"te', ' pad ']"),
    ("domain_over_array", "da", "'{1,NULL,3}'"),
    ("enum_array", "ea", "'{happy,NULL,sad}'"),
    ("enum_array_empty", "ea", "'{}'"),
]

# values the lake refuses by design: (case, column, literal, what the refusal names)
REFUSED_CASES: list[tuple[str, str, str, str]] = [
    ("array_deeper_than_declared", "ia", "'{{1,2},{3,4}}'", "dimension"),
    ("array_shallower_than_declared", "im", "'{1,2}'", "dimension"),
    ("ts_past_the_lake", "ts", "'294276-12-31 23:59:59'", "294247"),
    ("num2_nan", "n2", "'NaN'", "NaN"),
]
