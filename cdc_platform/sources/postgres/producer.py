"""Who writes a PostgreSQL source's topics, and the advice that fits: the platform's own
capture (``cdc-platform capture run``) or a Debezium connector, whose slot, heartbeat and
restart are the user's to manage (the platform must never stream from Debezium's slot)."""

from __future__ import annotations

from cdc_platform.config.producers import DebeziumProducer
from cdc_platform.sources.postgres.stream import PostgresEndpoint


def debezium_of(endpoint: PostgresEndpoint) -> DebeziumProducer | None:
    producer = endpoint.config.producer
    return producer if isinstance(producer, DebeziumProducer) else None


def producer_label(endpoint: PostgresEndpoint) -> str:
    debezium = debezium_of(endpoint)
    return f"debezium connector {debezium.connector}" if debezium else "platform capture"


def heartbeat_every_s(endpoint: PostgresEndpoint) -> float | None:
    """How often the source's producer writes a heartbeat record: the platform's capture
    every ``heartbeat_interval_s``; a Debezium connector every ``heartbeat.interval.ms``,
    None when that is 0 (Debezium's default: no heartbeats)."""
    debezium = debezium_of(endpoint)
    if debezium is None:
        return endpoint.config.heartbeat_interval_s
    try:
        every_ms = float(debezium.setting("heartbeat.interval.ms"))
    except ValueError:
        return None
    return every_ms / 1000 if every_ms > 0 else None


def start_producer_advice(endpoint: PostgresEndpoint) -> str:
    """What to do when the source's slot does not move."""
    debezium = debezium_of(endpoint)
    if debezium is None:
        return f"is capture running? start it: cdc-platform capture run --source {endpoint.name}"
    where = debezium.connect_url or "<kafka-connect-url>"
    return (
        f"its topics are written by Debezium connector '{debezium.connector}': check it "
        f"(GET {where}/connectors/{debezium.connector}/status) and restart a failed task "
        f"(POST {where}/connectors/{debezium.connector}/restart?includeTasks=true&onlyFailed=true); on a quiet "
        "database its slot moves only with heartbeats: set heartbeat.interval.ms and a heartbeat.action.query "
        "that writes to a table in its publication. Never run cdc-platform capture on this source: it would take "
        "over Debezium's slot"
    )


def refuse_platform_capture(endpoint: PostgresEndpoint) -> str | None:
    debezium = debezium_of(endpoint)
    if debezium is None:
        return None
    return (
        f"source {endpoint.name}'s topics are written by Debezium connector '{debezium.connector}' (producer: "
        f"debezium); the platform's capture would stream from the connector's slot {endpoint.slot} and lose its "
        "changes. Nothing to run here: the connector streams. To capture with the platform instead, remove the "
        "producer block and delete the connector first"
    )


def lost_slot_advice(endpoint: PostgresEndpoint) -> str:
    debezium = debezium_of(endpoint)
    assert debezium is not None
    return (
        f"Debezium's replication slot {endpoint.slot} is missing or lost: restart connector '{debezium.connector}' "
        "so it creates the slot again (snapshot.mode=no_data: it streams from there), then the new generation is "
        "taken after it; the platform does not create Debezium's slot"
    )


def unfed_cause(endpoint: PostgresEndpoint, qualified: str) -> str:
    """Why a table's topic would get nothing while the table changes, for its producer."""
    debezium = debezium_of(endpoint)
    if debezium is None:
        return (
            f"the platform's capture does not stream {qualified}: is it in publication "
            f"{endpoint.publication}? (cdc-platform capture run adds configured tables to it when it starts; "
            "restart capture, and check that nothing removes the table from the publication)"
        )
    return (
        f"Debezium connector '{debezium.connector}' does not capture {qualified}: add it to the connector's "
        "table.include.list (or remove it from table.exclude.list) and, if you manage the publication, to publication "
        f"{endpoint.publication}; then take a new generation of the table (cdc-platform rehydrate), since the "
        "changes it missed are not in Kafka"
    )
