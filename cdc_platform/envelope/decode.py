"""Envelope values back to Python values, for consumers (the lake, tests, verify).

Works from a Kafka Connect field schema (the ``schema`` part of our or Debezium's
envelope) so topics written by a real Debezium connector decode the same way.
"""

from __future__ import annotations

import base64
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from cdc_platform.envelope.pgtypes import EPOCH_DATE, bytes_to_decimal


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
        return date.fromordinal(EPOCH_DATE.toordinal() + int(value))
    if name == "io.debezium.time.MicroTime":
        return _time_of_day(int(value))
    if name == "io.debezium.time.Time":  # millis
        return _time_of_day(int(value) * 1000)
    if name == "io.debezium.time.MicroTimestamp":
        return datetime(1970, 1, 1) + timedelta(microseconds=int(value))
    if name == "io.debezium.time.Timestamp":  # millis
        return datetime(1970, 1, 1) + timedelta(milliseconds=int(value))
    if name == "io.debezium.time.ZonedTimestamp":
        return parse_zoned_timestamp(value)
    if type_ == "bytes":
        return base64.b64decode(value)
    if type_ == "array":
        return [from_connect(v, schema["items"]) for v in value]
    return value


def parse_zoned_timestamp(text: str) -> datetime | str:
    if text in ("infinity", "-infinity"):
        return text
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


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
