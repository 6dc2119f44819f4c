"""``apply``: one source's stream apply (``lake/apply.py``), long-running like capture, or
``--once`` to apply what is available and stop."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from typing import Any

from cdc_platform.cli.capture import pick_source
from cdc_platform.cli.main import CliError, Loaded, command


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "apply",
        help="apply a source's changes to the lake (changelog, current, history): one Spark application, "
        "continuous until stopped, or --once",
    )
    parser.add_argument("--source", help="source name (required when the config has several)")
    parser.add_argument("--once", action="store_true", help="apply everything available, then stop (scheduled mode)")
    command(parser, apply_run)


def apply_run(args: argparse.Namespace, loaded: Loaded) -> int:
    from cdc_platform.config.model import ApplyEngine
    from cdc_platform.kafka.clients import KafkaClients
    from cdc_platform.lake.apply import StreamApply
    from cdc_platform.lake.ledger import Ledger
    from cdc_platform.lake.schema_registry import schema_refresh
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.resources import CdcSparkResource
    from cdc_platform.sources import open_source

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = loaded.config
    name = pick_source(config, args.source)
    settings = config.sources[name].apply
    if settings.engine is not ApplyEngine.STREAM:
        raise CliError(
            f"source '{name}' is applied by changelog-window runs (apply.engine: {settings.engine.value}); "
            f"to apply it with one Spark application, set sources.{name}.apply.engine: stream"
        )
    kafka, ledger = KafkaClients(config.kafka), Ledger(config.lake.root)
    source = open_source(config, name, kafka)
    # the platform's PySpark resource: what a Dagster run materializes and what this process applies
    spark = CdcSparkResource.for_config(str(loaded.path)).spark_session
    tables = [lake_table(config, t) for t in config.tables_of(name)]
    engine = StreamApply(
        spark, ledger, kafka, tables, settings, refresh=lambda t: schema_refresh(ledger, source, t.config)
    )
    if args.once:
        applied = engine.run_until_caught_up()
        print(json.dumps({"batches": sum(a.batch is not None for a in applied), "tables": len(tables)}))
        return 0
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    engine.run_forever(stop, on_pass=_reporter(tables, source.format_position))
    return 0


def _reporter(tables: list[Any], position: Any) -> Any:
    """Runless materializations to the Dagster instance of ``$DAGSTER_HOME`` (the demo's),
    throttled; none when no instance is configured."""
    import os

    if not os.environ.get("DAGSTER_HOME"):
        logging.getLogger("cdc_platform.apply").info("DAGSTER_HOME is not set: nothing is reported to Dagster")
        return lambda _applied: None
    import dagster as dg

    from cdc_platform.orchestration.reporting import RunlessReporter

    return RunlessReporter(dg.DagsterInstance.get(), tables, position)
