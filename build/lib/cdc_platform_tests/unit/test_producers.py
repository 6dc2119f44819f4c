"""Who writes a source's topics decides the advice: never "start our capture" on a
Debezium connector's slot (that would take the slot over and lose its changes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_platform.config import load_config
from cdc_platform.model.errors import FatalError
from cdc_platform.sources import CaptureSettings, open_source
from cdc_platform.sources.postgres.producer import start_producer_advice
from cdc_platform.sources.postgres.source import PostgresConnector
from cdc_platform_tests.unit.test_config import VALID, with_debezium, write


def connector(tmp_path: Path, text: str) -> PostgresConnector:
    source = open_source(load_config(write(tmp_path, text)), "shop")
    assert isinstance(source, PostgresConnector)
    return source


def test_advice_for_a_debezium_source_names_the_connector_slot_and_heartbeat(tmp_path: Path) -> None:
    source = connector(tmp_path, with_debezium("        slot.name: dbz_shop\n"))
    assert source.endpoint.slot == "dbz_shop"  # the connector's slot is the one watched
    advice = start_producer_advice(source.endpoint)
    assert "Debezium connector 'shop-connector'" in advice
    assert "heartbeat.interval.ms" in advice and "heartbeat.action.query" in advice
    assert "restart" in advice and "cdc-platform capture run" not in advice


def test_the_platforms_capture_refuses_a_debezium_source(tmp_path: Path) -> None:
    source = connector(tmp_path, with_debezium())
    with pytest.raises(FatalError, match="Debezium connector 'shop-connector'") as info:
        source.capture(CaptureSettings())
    assert info.value.reason == "producer_is_debezium"


def test_advice_for_the_platforms_capture_is_to_start_it(tmp_path: Path) -> None:
    source = connector(tmp_path, VALID)
    assert start_producer_advice(source.endpoint) == (
        "is capture running? start it: cdc-platform capture run --source shop"
    )
