"""PostgreSQL types -> Debezium's JSON value representations and Kafka Connect schemas.

pgoutput sends every value in PostgreSQL's text format. The replication session runs
with ``TimeZone=UTC``, ``DateStyle=ISO`` and ``IntervalStyle=iso_8601`` so that text is
unambiguous. Representations follow Debezium's PostgreSQL connector defaults
(``decimal.handling.mode=precise``, ``time.precision.mode=adaptive`` at microsecond
precision, ``binary.handling.mode=bytes``), except intervals, which default to
Debezium's ``interval.handling.mode=string`` because the numeric mode approximates months
and is not exact. Every choice here is exact: numeric never goes through a float.

| PostgreSQL | JSON value | Connect schema (name) |
|---|---|---|
| smallint/integer/bigint, oid | number | int16/int32/int64 |
| real/double precision | number ("NaN", "Infinity" as strings) | float/double |
| numeric(p,s), money | base64 two's-complement unscaled bytes | bytes (org.apache.kafka.connect.data.Decimal) |
| numeric (no scale) | {"scale": s, "value": base64} | struct (io.debezium.data.VariableScaleDecimal) |
| boolean | true/false | boolean |
| date | days since 1970-01-01 | int32 (io.debezium.time.Date) |
| time | microseconds since midnight | int64 (io.debezium.time.MicroTime) |
| time with time zone | "HH:MM:SS[.f]Z" in UTC | string (io.debezium.time.ZonedTime) |
| timestamp | microseconds since the epoch | int64 (io.debezium.time.MicroTimestamp) |
| timestamp with time zone | "YYYY-MM-DDTHH:MM:SS[.f]Z" in UTC | string (io.debezium.time.ZonedTimestamp) |
| interval | ISO 8601 "P1Y2M3DT4H5M6.5S" (or micros) | string (io.debezium.time.Interval) |
| uuid / json, jsonb / enum | string | string (io.debezium.data.Uuid / Json / Enum) |
| bytea | base64 | bytes |
| arrays | JSON arrays of the element's representation | array |
| anything else | the text form | string |
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

JsonValue = Any

EPOCH_DATE = date(1970, 1, 1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
DAYS_PER_MONTH_AVG = 365.25 / 12.0  # Debezium's MicroDuration approximation

DecimalHandling = Literal["precise", "string"]
IntervalHandling = Literal["string", "numeric"]


class ConversionError(ValueError):
    """A value in PostgreSQL's text format that has no envelope representation."""

    def __init__(self, message: str, column: str | None = None, text: str | None = None) -> None:
        super().__init__(message)
        self.column, self.text = column, text


@dataclass(frozen=True)
class PgType:
    """What capture needs to know of a column type."""

    oid: int
    name: str
    kind: str  # see KINDS
    element: PgType | None = None
    enum_values: tuple[str, ...] = field(default=())


KINDS = {
    "int16", "int32", "int64", "float32", "float64", "numeric", "money", "bool", "text", "date",
    "time", "timetz", "timestamp", "timestamptz", "interval", "uuid", "json", "bytea", "enum", "array",
}  # fmt: skip

# oid -> (name, kind) for built-in scalar types
BUILTIN_TYPES: dict[int, tuple[str, str]] = {
    16: ("bool", "bool"),
    17: ("bytea", "bytea"),
    18: ("char", "text"),
    19: ("name", "text"),
    20: ("int8", "int64"),
    21: ("int2", "int16"),
    23: ("int4", "int32"),
    25: ("text", "text"),
    26: ("oid", "int64"),
    114: ("json", "json"),
    142: ("xml", "text"),
    650: ("cidr", "text"),
    700: ("float4", "float32"),
    701: ("float8", "float64"),
    790: ("money", "money"),
    829: ("macaddr", "text"),
    869: ("inet", "text"),
    1042: ("bpchar", "text"),
    1043: ("varchar", "text"),
    1082: ("date", "date"),
    1083: ("time", "time"),
    1114: ("timestamp", "timestamp"),
    1184: ("timestamptz", "timestamptz"),
    1186: ("interval", "interval"),
    1266: ("timetz", "timetz"),
    1560: ("bit", "text"),
    1562: ("varbit", "text"),
    1700: ("numeric", "numeric"),
    2950: ("uuid", "uuid"),
    3802: ("jsonb", "json"),
}
# array oid -> element oid for built-in array types
BUILTIN_ARRAYS: dict[int, int] = {
    1000: 16, 1001: 17, 1005: 21, 1007: 23, 1016: 20, 1009: 25, 1014: 1042, 1015: 1043,
    1021: 700, 1022: 701, 1231: 1700, 1182: 1082, 1183: 1083, 1115: 1114, 1185: 1184,
    1187: 1186, 1270: 1266, 2951: 2950, 199: 114, 3807: 3802, 1041: 869, 791: 790, 1028: 26,
}  # fmt: skip


def builtin_type(oid: int) -> PgType | None:
    if oid in BUILTIN_TYPES:
        name, kind = BUILTIN_TYPES[oid]
        return PgType(oid, name, kind)
    if oid in BUILTIN_ARRAYS:
        element = builtin_type(BUILTIN_ARRAYS[oid])
        assert element is not None
        return PgType(oid, f"_{element.name}", "array", element=element)
    return None


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of numeric(p,s); None for unconstrained numeric."""
    if typmod < 4:
        return None
    value = typmod - 4
    return (value >> 16) & 0xFFFF, value & 0xFFFF


# -- values ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ConversionOptions:
    decimal_handling: DecimalHandling = "precise"
    interval_handling: IntervalHandling = "string"


def to_json_value(text: str | None, pgtype: PgType, typmod: int, options: ConversionOptions) -> JsonValue:
    """Convert one value in PostgreSQL text format to its envelope representation."""
    if text is None:
        return None
    kind = pgtype.kind
    try:
        if kind in ("int16", "int32", "int64"):
            return int(text)
        if kind in ("float32", "float64"):
            number = float(text)
            return text if not math.isfinite(number) else number  # JSON has no NaN/Infinity
        if kind == "bool":
            return text == "t"
        if kind == "numeric":
            return _numeric(text, numeric_precision_scale(typmod), options)
        if kind == "money":
            return _numeric(re.sub(r"[^0-9.\-]", "", text), (19, 2), options)
        if kind == "date":
            return _date(text)
        if kind == "time":
            return _time_micros(text)
        if kind == "timetz":
            return _timetz(text)
        if kind == "timestamp":
            return _timestamp_micros(text)
        if kind == "timestamptz":
            return _timestamptz(text)
        if kind == "interval":
            return text if options.interval_handling == "string" else interval_micros(text)
        if kind == "bytea":
            return base64.b64encode(_bytea(text)).decode()
        if kind == "array":
            assert pgtype.element is not None
            # an array column's typmod applies to its elements (numeric(8,2)[])
            return _map_nested(parse_array(text), pgtype.element, typmod, options)
    except (ValueError, InvalidOperation, ArithmeticError) as exc:
        raise ConversionError(f"cannot convert {pgtype.name} value {text[:80]!r}: {exc}") from None
    return text  # text, varchar, uuid, json, jsonb, enum, inet, xml, …


def _map_nested(items: list[Any], element: PgType, typmod: int, options: ConversionOptions) -> list[Any]:
    return [
        _map_nested(item, element, typmod, options)
        if isinstance(item, list)
        else to_json_value(item, element, typmod, options)
        for item in items
    ]


def decimal_to_bytes(unscaled: int) -> bytes:
    """Java ``BigInteger.toByteArray()``: minimal big-endian two's complement."""
    length = (unscaled.bit_length() + 8) // 8 if unscaled >= 0 else ((-unscaled - 1).bit_length() + 8) // 8
    return unscaled.to_bytes(length, "big", signed=True)


def bytes_to_decimal(data: bytes, scale: int) -> Decimal:
    return decimal_from_unscaled(int.from_bytes(data, "big", signed=True), scale)


def decimal_from_unscaled(unscaled: int, scale: int) -> Decimal:
    """Exact at any precision (Decimal arithmetic would round to the context's 28 digits)."""
    digits = tuple(int(d) for d in str(abs(unscaled)))
    return Decimal((1 if unscaled < 0 else 0, digits, -scale))


def unscaled_int(value: Decimal, scale: int) -> int:
    """``value * 10**scale`` as an exact integer; refuses values with more decimals."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    number = int("".join(map(str, digits)) or "0")
    shift = exponent + scale
    if shift >= 0:
        number *= 10**shift
    else:
        number, remainder = divmod(number, 10**-shift)
        if remainder:
            raise ValueError(f"{value} has more than {scale} decimals")
    return int(-number if sign else number)


def _numeric(text: str, precision_scale: tuple[int, int] | None, options: ConversionOptions) -> JsonValue:
    value = Decimal(text)
    if not value.is_finite():
        # Debezium's precise mode cannot carry NaN/Infinity either; keep the text
        return text
    if options.decimal_handling == "string":
        return text
    if precision_scale is not None:
        unscaled = unscaled_int(value, precision_scale[1])
        return base64.b64encode(decimal_to_bytes(unscaled)).decode()
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    scale = max(-exponent, 0)
    return {"scale": scale, "value": base64.b64encode(decimal_to_bytes(unscaled_int(value, scale))).decode()}


def _date(text: str) -> int:
    if text == "infinity":
        return INT32_MAX
    if text == "-infinity":
        return INT32_MIN
    return _pg_date_days(text)


def _pg_date_days(text: str) -> int:
    """Days since 1970 of PostgreSQL's ISO date output, BC and years past 9999 included
    ('4714-11-24 BC' is astronomical year -4713; Python's date stops at 1..9999)."""
    day, _, era = text.partition(" ")
    year, month, dom = (int(part) for part in day.split("-"))
    if era not in ("", "BC"):
        raise ValueError(f"unexpected date text {text!r}")
    return days_from_civil(1 - year if era == "BC" else year, month, dom)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Proleptic Gregorian (astronomical year: 0 is 1 BC) to days since 1970-01-01."""
    if not (1 <= month <= 12 and 1 <= day <= 31):
        raise ValueError(f"no such date: {year}-{month}-{day}")
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """Days since 1970-01-01 to a proleptic Gregorian (year, month, day), any year."""
    days += 719468
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def iso_year(year: int) -> str:
    """A year as Java's ISO formatters print it ('-4713', '0001', '+10000'), so far years
    read the same in our envelopes and Debezium's."""
    if year > 9999:
        return f"+{year}"
    return f"-{-year:04d}" if year < 0 else f"{year:04d}"


def _split_time(text: str) -> int:
    hours, minutes, rest = text.split(":")
    seconds, _, fraction = rest.partition(".")
    micros = int((fraction + "000000")[:6]) if fraction else 0
    return ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1_000_000 + micros


def _time_micros(text: str) -> int:
    return _split_time(text)


_OFFSET = re.compile(r"(?P<sign>[+-])(?P<h>\d{2})(?::?(?P<m>\d{2}))?(?::?(?P<s>\d{2}))?$")


def _offset_micros(text: str) -> tuple[str, int]:
    match = _OFFSET.search(text)
    if not match:
        raise ValueError(f"no UTC offset in {text!r}")
    seconds = int(match["h"]) * 3600 + int(match["m"] or 0) * 60 + int(match["s"] or 0)
    sign = -1 if match["sign"] == "-" else 1
    return text[: match.start()], sign * seconds * 1_000_000


def _timetz(text: str) -> str:
    local, offset = _offset_micros(text)
    micros = (_split_time(local) - offset) % (86_400 * 1_000_000)
    seconds, fraction = divmod(micros, 1_000_000)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h:02d}:{m:02d}:{s:02d}{_fraction(fraction)}Z"


def _fraction(micros: int) -> str:
    # like Java's ISO formatters: no fraction when zero, else without trailing zeros
    return f".{micros:06d}".rstrip("0") if micros else ""


def _timestamp_micros(text: str) -> int:
    if text == "infinity":
        return INT64_MAX
    if text == "-infinity":
        return INT64_MIN
    micros = _local_micros(text)
    if not INT64_MIN < micros < INT64_MAX:  # the extremes mean ±infinity
        raise ValueError("beyond a 64-bit microsecond count (MicroTimestamp ends at 294247-01-10)")
    return micros


def _local_micros(text: str) -> int:
    text, era = _era(text)
    day, _, clock = text.partition(" ")
    days = _pg_date_days(day + era)
    return days * 86_400 * 1_000_000 + _split_time(clock)


def _era(text: str) -> tuple[str, str]:
    """PostgreSQL ends BC values with ' BC', after the time and the offset."""
    return (text[:-3], " BC") if text.endswith(" BC") else (text, "")


def _timestamptz(text: str) -> str:
    if text in ("infinity", "-infinity"):
        return text
    text, era = _era(text)
    local, offset = _offset_micros(text)
    micros = _local_micros(local + era) - offset
    return format_utc_micros(micros)


def format_utc_micros(micros: int) -> str:
    days, rest = divmod(micros, 86_400 * 1_000_000)
    seconds, fraction = divmod(rest, 1_000_000)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    year, month, day = civil_from_days(days)
    return f"{iso_year(year)}-{month:02d}-{day:02d}T{h:02d}:{m:02d}:{s:02d}{_fraction(fraction)}Z"


def _bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    raise ValueError("bytea not in hex format (bytea_output must be 'hex')")


_ISO_INTERVAL = re.compile(
    r"^P(?:(?P<years>-?\d+)Y)?(?:(?P<months>-?\d+)M)?(?:(?P<weeks>-?\d+)W)?(?:(?P<days>-?\d+)D)?"
    r"(?:T(?:(?P<hours>-?\d+)H)?(?:(?P<minutes>-?\d+)M)?(?:(?P<seconds>-?\d+(?:\.\d+)?)S)?)?$"
)


def interval_micros(text: str) -> int:
    """Debezium's MicroDuration: months approximated as 365.25/12 days."""
    match = _ISO_INTERVAL.match(text)
    if not match:
        raise ValueError(f"not an ISO 8601 interval: {text!r}")
    parts = {k: (Decimal(v) if v else Decimal(0)) for k, v in match.groupdict().items()}
    days = (
        (parts["years"] * 12 + parts["months"]) * Decimal(str(DAYS_PER_MONTH_AVG)) + parts["weeks"] * 7 + parts["days"]
    )
    seconds = days * 86_400 + parts["hours"] * 3600 + parts["minutes"] * 60 + parts["seconds"]
    return int(seconds * 1_000_000)


def parse_array(text: str) -> list[Any]:
    """Parse a PostgreSQL array literal (``{a,"b c",NULL,{1,2}}``) into nested lists of
    element texts (None for NULL)."""
    if text.startswith("["):  # explicit bounds: [0:2]={…}
        text = text[text.index("=") + 1 :]
    pos = 0

    def parse_list() -> list[Any]:
        nonlocal pos
        if text[pos] != "{":
            raise ValueError(f"array literal: expected '{{' at {pos}")
        pos += 1
        items: list[Any] = []
        if text[pos] == "}":
            pos += 1
            return items
        while True:
            if text[pos] == "{":
                items.append(parse_list())
            elif text[pos] == '"':
                pos += 1
                chars = []
                while text[pos] != '"':
                    if text[pos] == "\\":
                        pos += 1
                    chars.append(text[pos])
                    pos += 1
                pos += 1
                items.append("".join(chars))
            else:
                start = pos
                while text[pos] not in ",}":
                    pos += 1
                raw = text[start:pos].strip()
                items.append(None if raw == "NULL" else raw)
            if text[pos] == ",":
                pos += 1
                continue
            if text[pos] == "}":
                pos += 1
                return items
            raise ValueError(f"array literal: unexpected {text[pos]!r} at {pos}")

    try:
        result = parse_list()
    except IndexError:
        raise ValueError("array literal ends early") from None
    if pos != len(text):
        raise ValueError(f"array literal: trailing text at {pos}")
    return result


# -- schemas -----------------------------------------------------------------------------


def connect_schema(pgtype: PgType, typmod: int, options: ConversionOptions) -> dict[str, Any]:
    """The Kafka Connect (JsonConverter) schema of a column, without ``field``/``optional``."""
    kind = pgtype.kind
    simple = {
        "int16": "int16",
        "int32": "int32",
        "int64": "int64",
        "float32": "float",
        "float64": "double",
        "bool": "boolean",
        "text": "string",
    }
    if kind in simple:
        return {"type": simple[kind]}
    if kind in ("numeric", "money"):
        precision_scale = (19, 2) if kind == "money" else numeric_precision_scale(typmod)
        if options.decimal_handling == "string":
            return {"type": "string"}
        if precision_scale is None:
            return {
                "type": "struct",
                "name": "io.debezium.data.VariableScaleDecimal",
                "version": 1,
                "fields": [
                    {"type": "int32", "optional": False, "field": "scale"},
                    {"type": "bytes", "optional": False, "field": "value"},
                ],
            }
        precision, scale = precision_scale
        return {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
        }
    named = {
        "date": ("int32", "io.debezium.time.Date"),
        "time": ("int64", "io.debezium.time.MicroTime"),
        "timetz": ("string", "io.debezium.time.ZonedTime"),
        "timestamp": ("int64", "io.debezium.time.MicroTimestamp"),
        "timestamptz": ("string", "io.debezium.time.ZonedTimestamp"),
        "uuid": ("string", "io.debezium.data.Uuid"),
        "json": ("string", "io.debezium.data.Json"),
    }
    if kind in named:
        type_, name = named[kind]
        return {"type": type_, "name": name, "version": 1}
    if kind == "interval":
        if options.interval_handling == "string":
            return {"type": "string", "name": "io.debezium.time.Interval", "version": 1}
        return {"type": "int64", "name": "io.debezium.time.MicroDuration", "version": 1}
    if kind == "bytea":
        return {"type": "bytes"}
    if kind == "enum":
        return {
            "type": "string",
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": ",".join(pgtype.enum_values)},
        }
    if kind == "array":
        assert pgtype.element is not None
        return {"type": "array", "items": {**connect_schema(pgtype.element, typmod, options), "optional": True}}
    return {"type": "string"}
