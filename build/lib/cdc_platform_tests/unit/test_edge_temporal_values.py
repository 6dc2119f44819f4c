"""Dates and instants outside Python's range, through capture's conversion and the
changelog decoder (pure; the edge-values integration test runs them through PostgreSQL,
Kafka and Spark): BC, years past 9999, ±infinity, past 64-bit microseconds."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from cdc_platform.envelope.changes import lake_value
from cdc_platform.envelope.decode import parse_zoned_timestamp
from cdc_platform.envelope.pgtypes import (
    INT64_MAX,
    INT64_MIN,
    ConversionError,
    ConversionOptions,
    PgType,
    builtin_type,
    civil_from_days,
    days_from_civil,
    format_utc_micros,
    to_json_value,
)


def _type(oid: int) -> PgType:
    pgtype = builtin_type(oid)
    assert pgtype is not None
    return pgtype


DATE, TIMESTAMP, TIMESTAMPTZ = _type(1082), _type(1114), _type(1184)
OPTIONS = ConversionOptions()
DAY_MICROS = 86_400_000_000


def test_civil_days_agree_with_python_wherever_python_has_the_date() -> None:
    # every 97th day over the whole range (leap rules included), and the last day
    for ordinal in [*range(1, date.max.toordinal(), 97), date.max.toordinal()]:
        day = date.fromordinal(ordinal)
        days = (day - date(1970, 1, 1)).days
        assert days_from_civil(day.year, day.month, day.day) == days
        assert civil_from_days(days) == (day.year, day.month, day.day)


@pytest.mark.parametrize(
    ("text", "days"),
    [
        ("4714-11-24 BC", -2440588),  # Julian day 0, PostgreSQL's first date
        ("0001-12-31 BC", -719163),  # the day before 0001-01-01 (astronomical year 0)
        ("10000-01-01", 2932897),
        ("5874897-12-31", 2145042905),  # PostgreSQL's last date
        ("infinity", 2**31 - 1),
        ("-infinity", -(2**31)),
    ],
)
def test_capture_reads_every_date_postgresql_prints(text: str, days: int) -> None:
    assert to_json_value(text, DATE, -1, OPTIONS) == days


def test_bc_and_far_timestamps_are_microseconds_and_java_style_instants() -> None:
    assert to_json_value("4713-01-01 00:00:00 BC", TIMESTAMP, -1, OPTIONS) == -210863520000000000
    assert to_json_value("4714-11-24 00:00:00+00 BC", TIMESTAMPTZ, -1, OPTIONS) == "-4713-11-24T00:00:00Z"
    # the offset moves 0001-01-01 03:00+05 into 1 BC (year 0), as Java prints it
    assert to_json_value("0001-01-01 03:00:00+05", TIMESTAMPTZ, -1, OPTIONS) == "0000-12-31T22:00:00Z"
    assert to_json_value("12345-06-07 08:09:10.5+03", TIMESTAMPTZ, -1, OPTIONS) == "+12345-06-07T05:09:10.5Z"


def test_a_timestamp_past_64_bit_microseconds_is_unconvertible() -> None:
    with pytest.raises(ConversionError, match="64-bit microsecond"):
        to_json_value("294276-12-31 23:59:59", TIMESTAMP, -1, OPTIONS)


def test_the_decoder_keeps_integers_where_python_stops_and_datetimes_elsewhere() -> None:
    assert lake_value(-2440588, DATE, -1) == -2440588
    assert lake_value(0, DATE, -1) == date(1970, 1, 1)
    assert lake_value(-210863520000000000, TIMESTAMP, -1) == -210863520000000000
    assert lake_value(1_000_000, TIMESTAMP, -1) == datetime(1970, 1, 1, 0, 0, 1)
    assert lake_value("-4713-11-24T00:00:00Z", TIMESTAMPTZ, -1) == days_from_civil(-4713, 11, 24) * 86_400_000_000
    assert lake_value("2024-02-29T23:59:59.5Z", TIMESTAMPTZ, -1) == datetime(2024, 2, 29, 23, 59, 59, 500000, UTC)
    # ±infinity: the extreme instants, the same values the snapshot reads
    assert lake_value("infinity", TIMESTAMPTZ, -1) == INT64_MAX
    assert lake_value("-infinity", TIMESTAMPTZ, -1) == INT64_MIN
    with pytest.raises(ValueError, match="beyond the lake's timestamp range"):
        lake_value("+294276-12-31T23:59:59Z", TIMESTAMPTZ, -1)


@pytest.mark.parametrize(
    "micros",
    [days_from_civil(-4713, 11, 24) * DAY_MICROS, -1, 0, 253402300800000001, days_from_civil(0, 2, 29) * DAY_MICROS,
     INT64_MAX - 1, INT64_MIN + 1],
)  # fmt: skip
def test_capture_and_decoder_agree_on_every_instant(micros: int) -> None:
    text = format_utc_micros(micros)
    parsed = parse_zoned_timestamp(text)
    assert not isinstance(parsed, str)
    back = (
        parsed if isinstance(parsed, int) else (parsed - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    )
    assert back == micros, text


def test_nan_in_a_decimal_column_is_a_reason_and_keeps_its_text_in_numeric() -> None:
    numeric = _type(1700)
    typmod_12_2 = ((12 << 16) | 2) + 4
    with pytest.raises(ValueError, match=r"NaN does not fit the lake's decimal\(12, 2\)"):
        lake_value("NaN", numeric, typmod_12_2)
    assert [lake_value(v, numeric, -1) for v in ("NaN", "Infinity", "-Infinity")] == ["NaN", "Infinity", "-Infinity"]
