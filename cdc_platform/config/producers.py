"""Who writes a PostgreSQL source's topics: the platform's own capture, or an external
Debezium connector. Pure config: what the lake must know of the connector (its
representation settings, slot, publication, topic prefix) and which settings it refuses.

A Debezium setting that changes a value either decodes to the same lake value as the
platform's capture or is refused here, naming the setting to use. The ``settings`` block
mirrors the connector's config: a key left out means Debezium's default, so a default the
lake cannot take (``interval.handling.mode=numeric``, ``snapshot.mode=initial``,
``skipped.operations=t``) must be set explicitly, in the connector and here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cdc_platform.envelope.encoding import BinaryMode, DecimalMode, TimePrecisionMode, ValueEncoding


@dataclass(frozen=True)
class SettingRule:
    default: str
    accepted: tuple[str, ...]
    fix: str  # what to set instead, and why


# Debezium PostgreSQL connector 3.5 settings the lake depends on, with Debezium's defaults
DEBEZIUM_RULES: dict[str, SettingRule] = {
    "decimal.handling.mode": SettingRule(
        "precise", ("precise", "string"), "set decimal.handling.mode=precise (or string): double loses digits"
    ),
    "interval.handling.mode": SettingRule(
        "numeric",
        ("string",),
        "set interval.handling.mode=string: numeric gives microseconds that cannot say months, and "
        "snapshots hold ISO 8601 text ('P3DT11H')",
    ),
    "time.precision.mode": SettingRule(
        "adaptive",
        ("adaptive", "adaptive_time_microseconds"),
        "set time.precision.mode=adaptive_time_microseconds (or adaptive): connect drops microseconds",
    ),
    "binary.handling.mode": SettingRule(
        "bytes", ("bytes", "base64", "base64-url-safe", "hex"), "set binary.handling.mode=bytes"
    ),
    "hstore.handling.mode": SettingRule(
        "json", ("json",), "set hstore.handling.mode=json: the lake stores hstore as JSON text"
    ),
    "snapshot.mode": SettingRule(
        "initial",
        ("no_data", "never"),
        "set snapshot.mode=no_data: the platform takes its own generations (Debezium's 'r' events "
        "carry no watermark the lake could start from)",
    ),
    "skipped.operations": SettingRule(
        "t", ("none",), "set skipped.operations=none: with Debezium's default truncates are lost silently"
    ),
    "plugin.name": SettingRule("decoderbufs", ("pgoutput",), "set plugin.name=pgoutput"),
    "tombstones.on.delete": SettingRule("true", ("true", "false"), "set tombstones.on.delete=true or false"),
    "slot.name": SettingRule("debezium", (), ""),
    "publication.name": SettingRule("dbz_publication", (), ""),
    "topic.prefix": SettingRule("", (), ""),
    "heartbeat.interval.ms": SettingRule("0", (), ""),
    "heartbeat.action.query": SettingRule("", (), ""),
}
FREE_VALUED = {"slot.name", "publication.name", "topic.prefix", "heartbeat.interval.ms", "heartbeat.action.query"}


def debezium_setting_errors(settings: dict[str, str]) -> list[str]:
    """Every refused setting (given or defaulted), each with the fix."""
    errors = [
        f"'{key}' is not a setting the lake reads; remove it (known: {', '.join(sorted(DEBEZIUM_RULES))})"
        for key in settings
        if key not in DEBEZIUM_RULES
    ]
    for key, rule in DEBEZIUM_RULES.items():
        if key in FREE_VALUED:
            continue
        value = settings.get(key, rule.default)
        if value not in rule.accepted:
            given = "" if key in settings else " (Debezium's default)"
            errors.append(f"{key}={value}{given} is refused: {rule.fix}, in the connector and here")
    return errors


class DebeziumProducer(BaseModel):
    """The source's topics are written by a Debezium PostgreSQL connector (Kafka Connect)."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    kind: Literal["debezium"]
    connector: str = Field(min_length=1, description="The connector's name in Kafka Connect (advice names it).")
    connect_url: str | None = Field(
        default=None, pattern=r"^https?://", description="Kafka Connect's REST URL, for the connector's state."
    )
    settings: dict[str, str] = Field(
        default_factory=dict, description="The connector's settings the lake depends on, as set in the connector."
    )

    @field_validator("connect_url")
    @classmethod
    def _no_credentials_in_url(cls, value: str | None) -> str | None:
        """The URL is shown in advice (logs, check descriptions, the UI); the platform never
        calls it, so credentials in it would only leak."""
        if value is not None and "@" in value.split("://", 1)[1].split("/", 1)[0]:
            raise ValueError(
                "holds credentials (user:password@); it is only shown in advice (logs, check descriptions, the "
                "UI), never called: give the URL without them"
            )
        return value

    @field_validator("settings")
    @classmethod
    def _lake_can_read(cls, value: dict[str, str]) -> dict[str, str]:
        errors = debezium_setting_errors(value)
        if errors:
            raise ValueError("; ".join(errors))
        return value

    def setting(self, key: str) -> str:
        return self.settings.get(key, DEBEZIUM_RULES[key].default)

    def encoding(self) -> ValueEncoding:
        decimal: DecimalMode = "string" if self.setting("decimal.handling.mode") == "string" else "precise"
        time: TimePrecisionMode = (
            "adaptive_time_microseconds"
            if self.setting("time.precision.mode") == "adaptive_time_microseconds"
            else "adaptive"
        )
        binary: BinaryMode = {"base64": "base64", "base64-url-safe": "base64-url-safe", "hex": "hex"}.get(
            self.setting("binary.handling.mode"), "bytes"
        )  # type: ignore[assignment]
        return ValueEncoding(decimal, time, binary)


class PlatformProducer(BaseModel):
    """The platform's own capture (``cdc-platform capture run``) writes the topics."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["platform"] = "platform"
