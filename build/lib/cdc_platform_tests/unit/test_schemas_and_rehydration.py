"""Pure rules: schema compatibility per mode, and the rehydration decisions."""

from __future__ import annotations

import pytest

from cdc_platform.config.model import CompatibilityMode as Mode
from cdc_platform.model.rehydration import Reason, changelog_gap, signal_tables, slot_lost
from cdc_platform.model.schemas import ColumnVersion, SchemaVersion, compare, widens
from cdc_platform.orchestration.sensors.failures import failure_report


def v(*columns: tuple[str, str, bool, bool], key: tuple[str, ...] = ("id",)) -> SchemaVersion:
    return SchemaVersion(tuple(ColumnVersion(*c) for c in columns), key)


BASE = v(("id", "integer", False, False), ("qty", "integer", False, False), ("note", "text", True, False))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("smallint", "integer", True),
        ("integer", "bigint", True),
        ("bigint", "integer", False),
        ("integer", "numeric(12,0)", True),
        ("integer", "numeric(5,0)", False),
        ("real", "double precision", True),
        ("numeric(10,2)", "numeric(12,2)", True),
        ("numeric(10,2)", "numeric(10,3)", False),  # fewer integer digits
        ("numeric(10,2)", "numeric", True),
        ("character varying(10)", "character varying(20)", True),
        ("character varying(20)", "character varying(10)", False),
        ("character varying(10)", "text", True),
        ("text", "character varying(10)", False),
        ("integer[]", "bigint[]", True),  # element-wise
        ("integer[]", "bigint", False),
        ("timestamp without time zone", "timestamp with time zone", False),
    ],
)
def test_widening(old: str, new: str, expected: bool) -> None:
    assert widens(old, new) is expected


def test_backward_rules() -> None:
    ok = compare(BASE, v(*[(c.name, c.type_name, c.nullable, c.has_default) for c in BASE.columns],
                         ("extra", "text", True, False)), Mode.BACKWARD)  # fmt: skip
    assert ok.compatible and ok.added == ("extra",)
    required = v(*[(c.name, c.type_name, c.nullable, c.has_default) for c in BASE.columns], ("x", "int", False, False))
    assert "added NOT NULL without a default" in compare(BASE, required, Mode.BACKWARD).problems[0]
    defaulted = v(*[(c.name, c.type_name, c.nullable, c.has_default) for c in BASE.columns], ("x", "int", False, True))
    assert compare(BASE, defaulted, Mode.BACKWARD).compatible
    dropped_required = v(("id", "integer", False, False), ("note", "text", True, False))
    change = compare(BASE, dropped_required, Mode.BACKWARD)
    assert change.dropped == ("qty",) and "required column qty" in change.problems[0]
    dropped_optional = v(("id", "integer", False, False), ("qty", "integer", False, False))
    assert compare(BASE, dropped_optional, Mode.BACKWARD).compatible
    narrowed = v(("id", "integer", False, False), ("qty", "smallint", False, False), ("note", "text", True, False))
    assert "not a widening" in compare(BASE, narrowed, Mode.BACKWARD).problems[0]
    assert compare(BASE, narrowed, Mode.FORWARD).compatible
    assert not compare(BASE, narrowed, Mode.FULL).compatible
    assert compare(BASE, narrowed, Mode.NONE).compatible
    rekeyed = SchemaVersion(BASE.columns, ("id", "qty"))
    assert "primary key changed" in compare(BASE, rekeyed, Mode.BACKWARD).problems[0]


def test_forward_allows_required_additions_full_does_not() -> None:
    required = v(*[(c.name, c.type_name, c.nullable, c.has_default) for c in BASE.columns], ("x", "int", False, False))
    assert compare(BASE, required, Mode.FORWARD).compatible
    assert not compare(BASE, required, Mode.FULL).compatible


def test_schema_version_round_trips_and_fingerprints() -> None:
    assert SchemaVersion.from_json(BASE.to_json()) == BASE
    assert SchemaVersion.from_json(BASE.to_json()).fingerprint() == BASE.fingerprint()
    assert v(("id", "bigint", False, False)).fingerprint() != v(("id", "integer", False, False)).fingerprint()


def test_changelog_gap() -> None:
    assert changelog_gap("s.t", "g1", {0: 30, 1: 5}, {0: 30, 1: 0}) is None
    need = changelog_gap("s.t", "g1", {0: 30, 1: 5}, {0: 31, 1: 0})
    assert need is not None and need.reason is Reason.CHANGELOG_GAP
    assert "partition 0: needs offset 30, Kafka starts at 31" in need.detail and need.cause == "gap:g1"
    assert need.tags()["cdc/reason"] == "changelog_gap"


def test_slot_lost_needs_a_slot_that_existed() -> None:
    assert slot_lost("s", exists=False, wal_status=None, remembered_slot=None) is None  # capture never ran
    assert "no longer exists" in str(slot_lost("s", exists=False, wal_status=None, remembered_slot="s"))
    assert "invalidated" in str(slot_lost("s", exists=True, wal_status="lost", remembered_slot="s"))
    assert slot_lost("s", exists=True, wal_status="reserved", remembered_slot="s") is None


def test_signal_rows() -> None:
    local = {"public.orders": "shop.public.orders", "public.items": "shop.public.items"}
    debezium = '{"data-collections": ["public.orders", "other.x"], "type": "incremental"}'
    assert signal_tables("execute-snapshot", debezium, "shop", local) == ["shop.public.orders"]
    assert signal_tables("rehydrate", "shop.public.items", "shop", local) == ["shop.public.items"]
    assert signal_tables("rehydrate", '["public.items", "public.orders"]', "shop", local) == [
        "shop.public.items",
        "shop.public.orders",
    ]
    assert signal_tables("log", "public.items", "shop", local) == []  # other Debezium signals are not ours
    assert signal_tables("rehydrate", "{not json", "shop", local) == []


def test_failure_report_names_table_and_reason() -> None:
    text = failure_report({"cdc/table": "shop.public.orders", "cdc/reason": "changelog_gap"}, "boom")
    assert text == "run for shop.public.orders (rehydration: changelog_gap) failed: boom"
    assert failure_report({}, "x") == "run for unknown table failed: x"
