"""PostgreSQL log sequence numbers: ``'16/B374D848'`` <-> int."""

from __future__ import annotations


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    if not _ or not high or not low:
        raise ValueError(f"not an LSN: {text!r} (expected e.g. '16/B374D848')")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
