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
from cdc_platform.cli.main import CliError, Loaded, command, configure_process_logging


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "apply",
        help="apply sources' changes to the lake (changelog, current, history): one Spark application, "
        "continuous until stopped, or --once",
    )
    parser.add_argument(
        "--source", action="append", help="source name (repeat it to apply several in one Spark application)"
    )
    parser.add_argument("--all", action="store_true", help="every source whose apply.engine is stream")
    parser.add_argument(
        "--group",
        action="append",
        help="only the tables of this apply group (tables[].apply_group; repeat it for several): one process "
        "per group splits a big source over several Spark applications. Default: every group",
    )
    parser.add_argument("--once", action="store_true", help="apply everything available, then stop (scheduled mode)")
    command(parser, apply_run)


def streamed_sources(config: Any, names: list[str] | None, every: bool) -> list[str]:
    """The sources this apply applies: named (each must be streamed), or every streamed one."""
    from cdc_platform.config.model import ApplyEngine

    if every == bool(names):
        if not every and len(config.sources) == 1:
            names = list(config.sources)
        else:
            raise CliError(f"name the sources with --source (or use --all): {', '.join(sorted(config.sources))}")
    chosen = [n for n, s in config.sources.items() if s.apply.engine is ApplyEngine.STREAM] if every else names or []
    for name in chosen:
        pick_source(config, name)
        engine = config.sources[name].apply.engine
        if engine is not ApplyEngine.STREAM:
            raise CliError(
                f"source '{name}' is applied by changelog-window runs (apply.engine: {engine.value}); "
                f"to apply it with one Spark application, set sources.{name}.apply.engine: stream"
            )
    if not chosen:
        raise CliError("no source has apply.engine: stream; set sources.<name>.apply.engine: stream")
    return chosen


def grouped_tables(config: Any, sources: list[str], groups: list[str] | None) -> list[Any]:
    """The tables of ``sources`` in ``groups`` (every group when None); a named group that
    none of them has is an error naming the groups they have."""
    tables = [t for name in sources for t in config.tables_of(name)]
    if not groups:
        return tables
    unknown = sorted(set(groups) - {t.apply_group for t in tables})
    if unknown:
        have = sorted({t.apply_group for t in tables})
        raise CliError(
            f"no table of {', '.join(sources)} is in apply group {', '.join(unknown)} (its groups: "
            f"{', '.join(have)}); set tables[].apply_group, or name one of those"
        )
    return [t for t in tables if t.apply_group in groups]


def apply_run(args: argparse.Namespace, loaded: Loaded) -> int:
    from cdc_platform.kafka.clients import KafkaClients
    from cdc_platform.lake.apply import StreamApply
    from cdc_platform.lake.ledger import Ledger
    from cdc_platform.lake.schema_registry import schema_refresh
    from cdc_platform.lake.tables import lake_table
    from cdc_platform.orchestration.resources import CdcSparkResource
    from cdc_platform.sources import open_source
    from cdc_platform.sources.base import CaptureWatch

    configure_process_logging()
    config = loaded.config
    names = streamed_sources(config, args.source, args.all)
    kafka, ledger = KafkaClients(config.kafka), Ledger(config.lake.root)
    sources = {name: open_source(config, name, kafka) for name in names}
    # the platform's PySpark resource: what a Dagster run materializes and what this process applies
    spark = CdcSparkResource.for_config(str(loaded.path), long_running=True).spark_session
    tables = [lake_table(config, t) for t in grouped_tables(config, names, args.group)]
    # one source's settings for the engine's pace (the first named); each source keeps its own lease
    settings = config.sources[names[0]].apply
    with StreamApply(
        spark, ledger, kafka, tables, settings,
        refresh=lambda t: schema_refresh(ledger, sources[t.source], t.config),
    ) as engine:  # fmt: skip
        if args.once:
            applied = engine.run_until_caught_up()
            print(json.dumps({"batches": sum(a.batch is not None for a in applied), "tables": len(tables)}))
            return 0
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        formats = {name: source.format_position for name, source in sources.items()}
        engine.run_forever(stop, on_pass=_reporter(tables, formats, engine.positions, CaptureWatch(sources)))
    return 0


def _reporter(tables: list[Any], formats: Any, positions: Any, capture: Any) -> Any:
    """Runless materializations to the Dagster instance of ``$DAGSTER_HOME`` (the demo's),
    throttled; none when no instance is configured."""
    import os

    if not os.environ.get("DAGSTER_HOME"):
        logging.getLogger("cdc_platform.apply").info("DAGSTER_HOME is not set: nothing is reported to Dagster")
        return lambda _applied: None
    import dagster as dg

    from cdc_platform.orchestration.reporting import RunlessReporter

    return RunlessReporter(dg.DagsterInstance.get(), tables, str, positions=positions, formats=formats, capture=capture)
