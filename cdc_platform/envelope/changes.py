"""Kafka records -> change rows with lake values (the changelog's decoding, pure Python).

Accepts the platform's envelope and a real Debezium PostgreSQL connector's (JSON, with
or without the ``schema`` part): same fields, same representations. Values become the
lake types of ``cdc_platform/lake/lake_types.py`` so the changelog and the snapshot
agree on every type. A record that cannot be decoded raises ``ChangeDecodeError`` with
the reason; the changelog sends it to the dead-letter table.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson

from cdc_platform.envelope.debezium import UNAVAILABLE
from cdc_platform.envelope.decode import EPOCH_UTC, date_value, parse_zoned_timestamp, wall_clock_value
from cdc_platform.envelope.encoding import PLATFORM_ENCODING, ValueEncoding
from cdc_platform.envelope.lsn import format_lsn
from cdc_platform.envelope.pgtypes import (
    INT64_MAX,
    INT64_MIN,
    PgType,
    bytes_to_decimal,
    numeric_precision_scale,
)

MAX_DECIMAL_PRECISION = 38
NON_FINITE = {"NaN", "Infinity", "-Infinity"}
OPS = {"r", "c", "u", "d", "t"}
MAX_NUMERIC_DIGITS_BEFORE_POINT, MAX_NUMERIC_DIGITS_AFTER_POINT = 131_072, 16_383  # PostgreSQL's numeric
# the metadata instants kept (a source's commit time, a Kafka record's timestamp), 0002-01-01 to
# 9998-12-31 UTC: Python's datetime holds them in any time zone, and PySpark hands a collected
# timestamp back as local time (in the first day of year 1 that failed a batch's statistics
# in UTC, past ±2^63 µs Spark failed the batch, past year 9999 Python did)
INSTANT_MILLIS = (-62104060800000, 253370764799999)


class ChangeDecodeError(ValueError):
    """The record is not a change event this table can take; the message is the reason."""


@dataclass(frozen=True)
class LakeColumnSpec:
    name: str
    pgtype: PgType
    typmod: int
    dims: int = 1


@dataclass
class ChangeRow:
    op: str | None  # c/u/d/t/r; None for a tombstone
    commit_lsn: int | None = None
    lsn: int | None = None
    tx_id: int | None = None
    source_ts: datetime | None = None
    key: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    # columns whose value PostgreSQL did not send (unchanged TOAST): keep the current one
    unavailable: list[str] = field(default_factory=list)
    # fields of the images that the table's schema does not know (a column the source added)
    unknown: list[str] = field(default_factory=list)

    @property
    def is_tombstone(self) -> bool:
        return self.op is None


def decode_record(
    key: bytes | None, value: bytes | None, columns: list[LakeColumnSpec], encoding: ValueEncoding = PLATFORM_ENCODING
) -> ChangeRow:
    """One Kafka record as a change row. ``encoding`` is the producer's representation
    settings (Debezium's ``decimal.handling.mode``, ``time.precision.mode``,
    ``binary.handling.mode``): a short base64 string can be all digits and a number can
    count milliseconds or microseconds, so the representation must be known, not guessed."""
    if value is None:
        return ChangeRow(op=None, key=_parse_key(key))
    try:
        envelope = _loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChangeDecodeError(f"value is not JSON: {exc}") from None
    if isinstance(envelope, dict) and "payload" in envelope and "schema" in envelope:
        envelope = envelope["payload"]
    if not isinstance(envelope, dict):
        raise ChangeDecodeError("value is not a JSON object")
    if "cdc_unconvertible" in envelope:
        raise ChangeDecodeError(_unconvertible_reason(envelope))
    op = envelope.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise ChangeDecodeError(f"op is {op!r}, expected one of c, u, d, t, r")
    source = envelope.get("source")
    if not isinstance(source, dict):
        raise ChangeDecodeError("no 'source' block")
    lsn = _int_or_none(source.get("lsn"))
    sequence = source.get("sequence")
    row = ChangeRow(
        op=op,
        commit_lsn=_commit_lsn(sequence, lsn) if isinstance(sequence, str) else lsn,
        lsn=lsn,
        tx_id=_int_or_none(source.get("txId")),
        source_ts=instant_of_millis(source.get("ts_ms")),
        key=_parse_key(key),
    )
    if op == "t":
        return row
    for part in ("before", "after"):
        image = envelope.get(part)
        if image is None:
            continue
        if not isinstance(image, dict):
            raise ChangeDecodeError(f"'{part}' is not an object")
        values, unavailable = decode_image(image, columns, part, encoding)
        setattr(row, part, values)
        if part == "after":
            row.unavailable = unavailable
        extra = [name for name in image if name not in values]
        if extra:
            row.unknown = sorted({*row.unknown, *extra})
    if op in ("c", "u", "r") and row.after is None:
        raise ChangeDecodeError(f"op '{op}' without 'after'")
    if op == "d" and row.before is None and row.key is None:
        raise ChangeDecodeError("delete without 'before' and without a key")
    return row


def _commit_lsn(sequence: str, lsn: int | None) -> int | None:
    """The commit position: the first of ``source.sequence`` (``'["<commit lsn>", "<lsn>"]'``),
    or the LSN when it is null. Anything else there is malformed: a position read from a
    boolean or a float would order the change wrongly, and silently."""
    try:
        listed = _loads(sequence)
        first = listed[0] if isinstance(listed, list) else None
        if not isinstance(listed, list) or not isinstance(first, str | int | None) or isinstance(first, bool):
            raise ValueError(sequence)
        return int(first) if first is not None else lsn
    except (ValueError, IndexError):
        raise ChangeDecodeError(f"source.sequence {sequence!r} is not ['<lsn>', '<lsn>']") from None


def instant_of_millis(millis: Any) -> datetime | None:
    """Milliseconds since 1970 as an instant, for metadata (``source.ts_ms``, the source's
    commit time; a Kafka record's timestamp), not the row. Counted exactly (a float division
    lost the millisecond past the year 2242). None when it is not a number or not in
    ``INSTANT_MILLIS`` (a broken producer's): the change is kept."""
    if isinstance(millis, bool) or not isinstance(millis, int | float):
        return None
    low, high = INSTANT_MILLIS
    return EPOCH_UTC + timedelta(milliseconds=millis) if low <= millis <= high else None  # NaN compares false


def _unconvertible_reason(envelope: dict[str, Any]) -> str:
    """The dead-letter reason for capture's 'this value has no representation' event."""
    problem = envelope["cdc_unconvertible"] if isinstance(envelope["cdc_unconvertible"], dict) else {}
    source = envelope.get("source")
    lsn = _int_or_none(source.get("lsn")) if isinstance(source, dict) else None
    where = format_lsn(lsn) if lsn is not None else "?"
    return (
        f"capture could not convert {problem.get('table')}.{problem.get('column')} at LSN {where} "
        f"(op {problem.get('op')}): {problem.get('reason')}; value {problem.get('text')!r}. The row's change is not "
        "in the lake: under errors.tolerance: all it is this dead letter, under none the table stops here. Fix the "
        "value in the source, then rehydrate the table (cdc-platform rehydrate <table>)"
    )


def decode_image(
    image: dict[str, Any], columns: list[LakeColumnSpec], part: str, encoding: ValueEncoding = PLATFORM_ENCODING
) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    unavailable: list[str] = []
    for column in columns:
        raw = image.get(column.name)
        if _is_placeholder(raw, column, encoding):
            unavailable.append(column.name)
            values[column.name] = None
            continue
        try:
            values[column.name] = lake_value(raw, column.pgtype, column.typmod, encoding, column.dims)
        except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
            raise ChangeDecodeError(
                f"{part}.{column.name}: cannot read {str(raw)[:60]!r} as {column.pgtype.name}: {exc}"
            ) from None
    return values, unavailable


def _is_placeholder(raw: Any, column: LakeColumnSpec, encoding: ValueEncoding) -> bool:
    if raw in (UNAVAILABLE, [UNAVAILABLE]):
        return True
    return column.pgtype.kind == "bytea" and raw == encoding.binary_text(UNAVAILABLE.encode())


def lake_value(
    raw: Any, pgtype: PgType, typmod: int, encoding: ValueEncoding = PLATFORM_ENCODING, dims: int = 1
) -> Any:
    """A Debezium JSON value as the lake stores it (see lake/lake_types.py)."""
    if raw is None:
        return None
    kind = pgtype.kind
    if kind in ("int16", "int32", "int64"):
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise TypeError("not an integer")
        return raw
    if kind in ("float32", "float64"):
        return float(raw)  # "NaN" / "Infinity" strings included
    if kind == "bool":
        if not isinstance(raw, bool):
            raise TypeError("not a boolean")
        return raw
    if kind in ("numeric", "money"):
        scale = (19, 2) if kind == "money" else numeric_precision_scale(typmod)
        return _numeric(raw, scale, precise=encoding.decimal == "precise")
    if kind == "date":  # days since 1970; BC and years past 9999 stay days (Arrow's date32 takes them)
        return date_value(int(raw))
    if kind == "time":
        if not isinstance(raw, int):
            return str(raw)
        return format_time_micros(raw * 1000 if encoding.in_millis(kind, typmod) else raw)
    if kind == "timestamp":
        unit = 1000 if encoding.in_millis(kind, typmod) else 1
        return wall_clock_value(_in_int64(int(raw) * unit))
    if kind == "timestamptz":
        parsed = parse_zoned_timestamp(str(raw))
        if isinstance(parsed, str):  # ±infinity: the extreme instants, as the snapshot reads them
            return INT64_MAX if parsed == "infinity" else INT64_MIN
        return _in_int64(parsed) if isinstance(parsed, int) else parsed
    if kind == "bytea":
        return encoding.binary_value(str(raw))
    if kind == "array":
        assert pgtype.element is not None
        if not isinstance(raw, list):
            raise TypeError("not an array")
        return _array(raw, pgtype.element, typmod, encoding, dims)
    if kind == "json" and not isinstance(raw, str):
        return json.dumps(raw)
    return str(raw) if not isinstance(raw, str) else raw


def _in_int64(micros: int) -> int:
    """The lake's timestamps are 64-bit microseconds (to 294247-01-10); PostgreSQL goes to 294276."""
    if not INT64_MIN <= micros <= INT64_MAX:
        raise ValueError("the instant is beyond the lake's timestamp range (294247-01-10, 64-bit microseconds)")
    return micros


def _array(items: list[Any], element: PgType, typmod: int, encoding: ValueEncoding, dims: int) -> list[Any]:
    """Nested lists exactly ``dims`` deep (the column's lake type). PostgreSQL does not
    enforce declared dimensions, so another depth is a reason, not a value Arrow fails
    on in a Spark task. An empty array fits any depth."""
    depth = _depth(items)
    if items and depth != max(dims, 1):
        raise ValueError(f"the value has {depth} dimension(s), the column's lake type {max(dims, 1)}")
    return _map_elements(items, element, typmod, encoding)


def _map_elements(items: list[Any], element: PgType, typmod: int, encoding: ValueEncoding) -> list[Any]:
    return [
        _map_elements(v, element, typmod, encoding) if isinstance(v, list) else lake_value(v, element, typmod, encoding)
        for v in items
    ]


def _check_within_postgresql(value: Decimal) -> None:
    """PostgreSQL's numeric holds 131 072 digits before the point and 16 383 after. A value
    past either is not one it sent; written out as text (the lake's form of an unconstrained
    numeric) a scale of 86 400 000 000 took the worker's memory before failing."""
    if not value.is_finite():
        return
    exponent = value.as_tuple().exponent
    before, after = max(value.adjusted() + 1, 0), max(-exponent if isinstance(exponent, int) else 0, 0)
    if before > MAX_NUMERIC_DIGITS_BEFORE_POINT or after > MAX_NUMERIC_DIGITS_AFTER_POINT:
        raise ValueError(
            f"{before} digits before the point and {after} after: beyond PostgreSQL's numeric "
            f"({MAX_NUMERIC_DIGITS_BEFORE_POINT} and {MAX_NUMERIC_DIGITS_AFTER_POINT})"
        )


def _depth(items: list[Any]) -> int:
    return 1 + max((_depth(v) for v in items if isinstance(v, list)), default=0)


def _numeric(raw: Any, precision_scale: tuple[int, int] | None, precise: bool) -> Decimal | str:
    if isinstance(raw, dict):  # VariableScaleDecimal
        value = bytes_to_decimal(base64.b64decode(raw["value"], validate=True), int(raw["scale"]))
    elif precise and isinstance(raw, str) and precision_scale is not None and raw not in NON_FINITE:
        value = bytes_to_decimal(base64.b64decode(raw, validate=True), precision_scale[1])
    elif isinstance(raw, int | float | str):
        value = Decimal(str(raw))  # decimal.handling.mode=string/double, or NaN as text
    else:
        raise TypeError("not a decimal")
    _check_within_postgresql(value)
    if precision_scale is not None and precision_scale[0] <= MAX_DECIMAL_PRECISION:
        if not value.is_finite():
            raise ValueError(
                f"{value} does not fit the lake's decimal{precision_scale} (only numeric without (p,s) keeps it)"
            )
        return value
    # plain digits as PostgreSQL prints them (str() would give '-1E-36' for tiny values)
    return format(value, "f")


def format_time_micros(micros: int) -> str:
    """PostgreSQL's time output: HH:MM:SS with the fraction only if non-zero."""
    seconds, fraction = divmod(micros, 1_000_000)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    text = f"{h:02d}:{m:02d}:{s:02d}"
    return text + f".{fraction:06d}".rstrip("0") if fraction else text


def _parse_key(key: bytes | None) -> dict[str, Any] | None:
    if key is None:
        return None
    try:
        parsed = _loads(key)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChangeDecodeError(f"key is not JSON: {exc}") from None
    if isinstance(parsed, dict) and "payload" in parsed and "schema" in parsed:
        parsed = parsed["payload"]
    if not isinstance(parsed, dict):
        raise ChangeDecodeError("key is not a JSON object")
    return parsed


def _loads(data: bytes | str) -> Any:
    # orjson is several times faster; it refuses what the standard parser accepts (integers
    # beyond 64 bits, NaN literals, non-UTF-8 encodings), and those take the standard path
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except RecursionError:  # orjson stops at 1 024 levels, the standard parser near 1 000
        raise json.JSONDecodeError("nested too deeply to read", "", 0) from None


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | str) and str(value).lstrip("-").isdigit() else None
