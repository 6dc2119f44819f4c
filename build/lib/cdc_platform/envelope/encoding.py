"""How a producer writes the values whose representation is a setting of the producer
(named as Debezium names them). The lake must know it: a JSON number alone cannot say
whether it counts milliseconds or microseconds, nor a short string whether it is base64."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass
from typing import Literal

DecimalMode = Literal["precise", "string"]
# micro: every time/timestamp in microseconds (the platform's capture, at any precision);
# adaptive: time(0-3)/timestamp(0-3) in milliseconds, (4-6) in microseconds (Debezium);
# adaptive_time_microseconds: as adaptive, but time always in microseconds (Debezium)
TimePrecisionMode = Literal["micro", "adaptive", "adaptive_time_microseconds"]
BinaryMode = Literal["bytes", "base64", "base64-url-safe", "hex"]
MILLIS_PRECISION = 3  # precision at or below which Debezium's adaptive mode writes milliseconds


@dataclass(frozen=True)
class ValueEncoding:
    decimal: DecimalMode = "precise"
    time_precision: TimePrecisionMode = "micro"
    binary: BinaryMode = "bytes"  # bytes in JSON are base64, as the platform writes them

    def to_option(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_option(cls, text: str | None) -> ValueEncoding:
        return cls(**json.loads(text)) if text else cls()

    def in_millis(self, kind: str, typmod: int) -> bool:
        """Whether a time/timestamp column's integers count milliseconds (typmod: precision, -1 = 6)."""
        if self.time_precision == "micro" or not 0 <= typmod <= MILLIS_PRECISION:
            return False
        return kind == "timestamp" or (kind == "time" and self.time_precision == "adaptive")

    def binary_text(self, value: bytes) -> str:
        if self.binary == "hex":
            return value.hex()
        if self.binary == "base64-url-safe":
            return base64.urlsafe_b64encode(value).decode()
        return base64.b64encode(value).decode()

    def binary_value(self, raw: str) -> bytes:
        if self.binary == "hex":
            return bytes.fromhex(raw)
        if self.binary == "base64-url-safe":
            return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        return base64.b64decode(raw, validate=True)


PLATFORM_ENCODING = ValueEncoding()
