"""Envelope values back to Python values, for consumers (the lake, tests, verify).

Works from a Kafka Connect field schema (the ``schema`` part of our or Debezium's
envelope) so topics written by a real Debezium connector decode the same way.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from cdc_platform.envelope.pgtypes import EPOCH_DATE, bytes_to_decimal, days_from_civil

EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
EPOCH_NAIVE = datetime(1970, 1, 1)
_MAX_ORDINAL = date(9999, 12, 31).toordinal()


def from_connect(value: Any, schema: dict[str, Any]) -> Any:
    """Decode one field value given its Connect schema."""
    if value is None:
        return None
    name = schema.get("name")
    type_ = schema.get("type")
    if name == "org.apache.kafka.connect.data.Decimal":
        if isinstance(value, str) and not _is_base64(value):
            return Decimal(value)  # NaN/Infinity travel as text
        return bytes_to_decimal(base64.b64decode(value), int(schema["parameters"]["scale"]))
    if name == "io.debezium.data.VariableScaleDecimal":
        if isinstance(value, str):
            return Decimal(value)
        return bytes_to_decimal(base64.b64decode(value["value"]), int(value["scale"]))
    if name == "io.debezium.time.Date":
        return date_value(int(value))
    if name == "io.debezium.time.MicroTime":
        return _time_of_day(int(value))
    if name == "io.debezium.time.Time":  # millis
        return _time_of_day(int(value) * 1000)
    if name == "io.debezium.time.MicroTimestamp":
        return wall_clock_value(int(value))
    if name == "io.debezium.time.Timestamp":  # millis
        return wall_clock_value(int(value) * 1000)
    if name == "io.debezium.time.ZonedTimestamp":
        return parse_zoned_timestamp(value)
    if type_ == "bytes":
        return base64.b64decode(value)
    if type_ == "array":
        return [from_connect(v, schema["items"]) for v in value]
    return value


_ZONED = re.compile(
    r"^(?P<year>[+-]?\d{4,})-(?P<month>\d{2})-(?P<day>\d{2})T(?P<h>\d{2}):(?P<m>\d{2})(?::(?P<s>\d{2})(?:\.(?P<f>\d{1,9}))?)?"
    r"(?:Z|(?P<sign>[+-])(?P<oh>\d{2}):?(?P<om>\d{2})?(?::?(?P<os>\d{2}))?)$"
)
_MICROS_PER_DAY = 86_400 * 1_000_000
# the instants Python's datetime holds (0001-01-01 .. 9999-12-31, UTC), as microseconds since 1970
_PY_MIN_MICROS = days_from_civil(1, 1, 1) * _MICROS_PER_DAY
_PY_MAX_MICROS = (days_from_civil(9999, 12, 31) + 1) * _MICROS_PER_DAY - 1


def parse_zoned_timestamp(text: str) -> datetime | int | str:
    """A ZonedTimestamp as an aware UTC datetime, or as microseconds since 1970 when
    Python's datetime cannot hold it (BC, years past 9999: '-4713-11-24T00:00:00Z',
    '+10000-01-01T00:00:00Z'). 'infinity'/'-infinity' stay text."""
    if text in ("infinity", "-infinity"):
        return text
    micros = zoned_micros(text)
    return instant_value(micros)


def zoned_micros(text: str) -> int:
    match = _ZONED.match(text)
    if not match:
        raise ValueError(f"not an ISO 8601 instant: {text!r}")
    days = days_from_civil(int(match["year"]), int(match["month"]), int(match["day"]))
    seconds = int(match["h"]) * 3600 + int(match["m"]) * 60 + int(match["s"] or 0)
    offset = (int(match["oh"] or 0) * 3600 + int(match["om"] or 0) * 60 + int(match["os"] or 0)) * (
        -1 if match["sign"] == "-" else 1
    )
    fraction = int(((match["f"] or "") + "000000")[:6])
    return days * _MICROS_PER_DAY + (seconds - offset) * 1_000_000 + fraction


def instant_value(micros: int) -> datetime | int:
    """An aware UTC datetime, or the microseconds themselves outside Python's range
    (Arrow and the lake take either)."""
    if _PY_MIN_MICROS <= micros <= _PY_MAX_MICROS:
        return EPOCH_UTC + timedelta(microseconds=micros)
    return micros


def wall_clock_value(micros: int) -> datetime | int:
    """A naive datetime (timestamp without time zone), or the microseconds outside Python's range."""
    if _PY_MIN_MICROS <= micros <= _PY_MAX_MICROS:
        return EPOCH_NAIVE + timedelta(microseconds=micros)
    return micros


def date_value(days: int) -> date | int:
    """A date, or the days since 1970 outside Python's range (BC, years past 9999)."""
    ordinal = EPOCH_DATE.toordinal() + days
    if 1 <= ordinal <= _MAX_ORDINAL:
        return date.fromordinal(ordinal)
    return days


def _time_of_day(micros: int) -> time | timedelta:
    if micros >= 86_400 * 1_000_000:  # PostgreSQL allows 24:00:00
        return timedelta(microseconds=micros)
    seconds, fraction = divmod(micros, 1_000_000)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return time(h, m, s, fraction)


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        return False
    return True


def field_schemas(envelope_schema: dict[str, Any], part: str = "after") -> dict[str, dict[str, Any]]:
    """Column name -> field schema from an envelope's value schema."""
    row = next(f for f in envelope_schema["fields"] if f["field"] == part)
    return {f["field"]: f for f in row["fields"]}
