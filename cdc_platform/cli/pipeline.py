"""Commands on the pipeline: config check, snapshot, rehydrate, current, verify, dead-letters."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cdc_platform.cli.main import CliError, Loaded, command
from cdc_platform.config import PlatformConfig, TableConfig


def register(sub: Any) -> None:
    config = sub.add_parser("config", help="the config file")
    config_sub = config.add_subparsers(dest="action", required=True)
    command(config_sub.add_parser("check", help="validate the config and list its tables"), config_check)

    snap = sub.add_parser("snapshot", help="take a new snapshot generation of tables (a Dagster run each)")
    _table_arguments(snap)
    snap.add_argument("--if-missing", action="store_true", help="only tables without a committed generation")
    snap.add_argument("--reason", default="manual", help="recorded in the run's tags (cdc/reason)")
    snap.add_argument(
        "--resume",
        action="store_true",
        help="run each table's interrupted generation again (snapshot.mode: incremental): its chunks already "
        "written are not read again",
    )
    command(snap, snapshot)

    reh = sub.add_parser("rehydrate", help="a new snapshot generation, then current rebuilt from it (reason manual)")
    _table_arguments(reh)
    command(reh, rehydrate)

    cur = sub.add_parser("current", help="apply the changelog to tables' current state (a Dagster run each)")
    _table_arguments(cur)
    command(cur, current)

    ver = sub.add_parser("verify", help="wait until current has applied the source's position, then compare")
    ver.add_argument("tables", nargs="*", help="source.schema.table … (default: every table)")
    ver.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for capture and current, in all")
    ver.add_argument(
        "--parallel", type=int, default=2, help="tables verified at once (one Spark session runs them side by side)"
    )
    ver.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="attempts per table when a round cannot compare (a truncate or a new generation in flight)",
    )
    command(ver, verify)

    dead = sub.add_parser(
        "dead-letters", help="tables' dead letters: how many, where and why; --examined marks them examined"
    )
    dead.add_argument("tables", nargs="*", help="source.schema.table … (default: every table)")
    dead.add_argument(
        "--examined",
        action="store_true",
        help="mark every dead letter the tables hold now as examined: the completeness check counts only newer ones",
    )
    command(dead, dead_letters)


def _table_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tables", nargs="*", help="source.schema.table … (or --all)")
    parser.add_argument("--all", action="store_true", help="every configured table")


def selected_tables(config: PlatformConfig, names: list[str], all_tables: bool) -> list[TableConfig]:
    if all_tables == bool(names):
        raise CliError("name tables (source.schema.table …) or use --all")
    try:
        return list(config.tables) if all_tables else [config.table(name) for name in names]
    except KeyError as exc:
        raise CliError(str(exc.args[0])) from None


def config_check(_args: argparse.Namespace, loaded: Loaded) -> int:
    config = loaded.config
    print(f"ok: {len(config.sources)} source(s), {len(config.tables)} table(s) ({loaded.path})")
    for table in config.tables:
        key = ", ".join(table.primary_key) if table.primary_key else "(from the source's primary key)"
        # a streamed changelog is partitioned by day (or hour), whatever changelog.window says
        applied = (
            f"apply=stream partition={table.changelog.partition}"
            if config.streamed(table)
            else f"apply=windows window={table.changelog.window}"
        )
        print(
            f"  {table.key:40s} topic={config.topic_for(table)} key={key} {applied} "
            f"compatibility={table.compatibility.value} errors.tolerance={table.errors.tolerance.value}"
        )
    return 0


def snapshot(args: argparse.Namespace, loaded: Loaded) -> int:
    from cdc_platform.orchestration.runs import start_generations

    tables = selected_tables(loaded.config, args.tables, args.all)
    failed = 0
    runs = start_generations(loaded.path, tables, reason=args.reason, if_missing=args.if_missing, resume=args.resume)
    for run in runs:
        state = f"{run.rows} rows" if run.success else "FAILED (see the run in the Dagster UI)"
        print(f"{run.table}: generation {run.generation}: {state} (run {run.run_id})")
        failed += not run.success
    return 1 if failed else 0


def rehydrate(args: argparse.Namespace, loaded: Loaded) -> int:
    from cdc_platform.orchestration.runs import apply_current, start_generations

    tables = selected_tables(loaded.config, args.tables, args.all)
    failed, done = 0, []
    for run in start_generations(loaded.path, tables, reason="manual"):
        state = f"{run.rows} rows" if run.success else "FAILED (see the run in the Dagster UI)"
        print(f"{run.table}: generation {run.generation} (reason manual): {state} (run {run.run_id})")
        failed += not run.success
        if run.success:
            done.append(loaded.config.table(run.table))
    for table, success, run_id in apply_current(loaded.path, done):
        print(f"{table}: current {'rebuilt' if success else 'FAILED (see the run in the Dagster UI)'} (run {run_id})")
        failed += not success
    return 1 if failed else 0


def current(args: argparse.Namespace, loaded: Loaded) -> int:
    from cdc_platform.orchestration.runs import apply_current

    failed = 0
    for table, success, run_id in apply_current(loaded.path, selected_tables(loaded.config, args.tables, args.all)):
        print(f"{table}: {'applied' if success else 'FAILED (see the run in the Dagster UI)'} (run {run_id})")
        failed += not success
    return 1 if failed else 0


def verify(args: argparse.Namespace, loaded: Loaded) -> int:
    from cdc_platform.kafka.clients import KafkaClients
    from cdc_platform.lake.ledger import Ledger
    from cdc_platform.lake.session import get_spark_session
    from cdc_platform.lake.tables import LakeTable, lake_table
    from cdc_platform.lake.verify import VerifyContext, format_verdicts, verify_tables
    from cdc_platform.sources import open_sources

    config = loaded.config
    tables = selected_tables(config, args.tables, not args.tables)
    for name in {t.source for t in tables}:  # a missing password fails now, not after Spark started
        config.sources[name].password(name)
    kafka, ledger = KafkaClients(config.kafka), Ledger(config.lake.root)
    sources = open_sources(config, kafka)
    spark = get_spark_session(config.spark, "cdc_platform_verify", config.lake)

    def context(table: LakeTable) -> VerifyContext:
        return VerifyContext(spark, ledger, sources[table.source], kafka, log=lambda m: print(m, file=sys.stderr))

    lake_tables = [lake_table(config, t) for t in tables]
    verdicts = verify_tables(context, lake_tables, args.timeout, args.rounds, args.parallel)  # one timeout for all
    print(format_verdicts(verdicts))
    return 0 if all(v.ok for v in verdicts) else 1


def dead_letters(args: argparse.Namespace, loaded: Loaded) -> int:
    from datetime import UTC, datetime

    from cdc_platform.lake.dead_letters import count_dead_letters, marks_for_present, read_dead_letters
    from cdc_platform.lake.ledger import Ledger
    from cdc_platform.lake.tables import lake_table

    config = loaded.config
    ledger = Ledger(config.lake.root)
    for table in (lake_table(config, t) for t in selected_tables(config, args.tables, not args.tables)):
        present = read_dead_letters(table.dead_letters_path)  # read once: the marks cover what is counted
        if args.examined:
            ledger.mark_dead_letters_examined(table.key, marks_for_present(present, datetime.now(UTC)))
        counts = count_dead_letters(present, ledger.dead_letters_examined(table.key))
        print(
            f"{table.key}: {counts.total} dead letter(s), {counts.examined} examined, "
            f"{counts.total - counts.examined} not (errors.dead_letter_threshold="
            f"{table.config.errors.dead_letter_threshold} per changelog partition)"
        )
        for partition, count in counts.unexamined_by_partition.items():
            print(f"  changelog partition {partition}: {count} not examined")
        for line in counts.sample:
            print(f"  {line}")
    return 0
