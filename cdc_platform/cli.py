"""``cdc-platform``: the command line.

cdc-platform dev up|down|status [--profile dev|test]
cdc-platform config check [--config PATH]
cdc-platform demo setup|load|pgbench …
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cdc_platform.config import ConfigError, load_config

if TYPE_CHECKING:
    from cdc_platform.config import PlatformConfig, TableConfig
    from cdc_platform.devstack.profiles import StackProfile


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


class CliError(RuntimeError):
    """An expected failure with a message for the user (no traceback)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc-platform", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="the local stack (PostgreSQL + Kafka) under .cdc/<profile>/")
    dev_sub = dev.add_subparsers(dest="action", required=True)
    for action, helptext in (
        ("up", "start what is not running (idempotent)"),
        ("down", "stop what this stack started"),
        ("status", "show what runs"),
    ):
        p = dev_sub.add_parser(action, help=helptext)
        p.add_argument("--profile", default="dev", help="dev (the demo, default) or test (the test suite)")
        p.set_defaults(func=_dev)

    config = sub.add_parser("config", help="the config file")
    config_sub = config.add_subparsers(dest="action", required=True)
    check = config_sub.add_parser("check", help="validate the config and list its tables")
    check.add_argument("--config", help="path (default: $CDC_PLATFORM_CONFIG or ./cdc_platform.yaml)")
    check.set_defaults(func=_config_check)

    capture = sub.add_parser(
        "capture", help="changes into Kafka: PostgreSQL logical decoding, or polling for jdbc sources"
    )
    capture_sub = capture.add_subparsers(dest="action", required=True)
    run = capture_sub.add_parser("run", help="stream changes (until stopped, or --until-caught-up)")
    run.add_argument("--config", help="path (default: $CDC_PLATFORM_CONFIG or ./cdc_platform.yaml)")
    run.add_argument("--source", help="source name (required when the config has several)")
    run.add_argument(
        "--until-caught-up", action="store_true", help="stop once every change committed before start is in Kafka"
    )
    run.add_argument("--status-file", help="write position, lag and counts here as JSON")
    run.add_argument(
        "--new-slot",
        action="store_true",
        help="create a new replication slot although the previous one was lost (after rehydrating the tables)",
    )
    run.set_defaults(func=_capture_run)
    cstatus = capture_sub.add_parser(
        "status", help="the replication slot (position, lag in bytes, state), or a jdbc source's stored cursors"
    )
    cstatus.add_argument("--config")
    cstatus.add_argument("--source")
    cstatus.set_defaults(func=_capture_status)

    snap = sub.add_parser("snapshot", help="take a new snapshot generation of tables (a Dagster run)")
    snap.add_argument("tables", nargs="*", help="source.schema.table … (default with --all: every table)")
    snap.add_argument("--all", action="store_true", help="every configured table")
    snap.add_argument("--if-missing", action="store_true", help="only tables that have no generation yet")
    snap.add_argument("--reason", default="manual", help="recorded in the run's tags (cdc/reason)")
    snap.add_argument("--config")
    snap.set_defaults(func=_snapshot)

    reh = sub.add_parser(
        "rehydrate", help="a new snapshot generation, then current rebuilt from it (Dagster runs, reason manual)"
    )
    reh.add_argument("tables", nargs="*", help="source.schema.table … (or --all)")
    reh.add_argument("--all", action="store_true", help="every configured table")
    reh.add_argument("--config")
    reh.set_defaults(func=_rehydrate)

    ver = sub.add_parser(
        "verify", help="wait until current has applied the source's position, then compare it row by row"
    )
    ver.add_argument("tables", nargs="*", help="source.schema.table … (default: every table)")
    ver.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for capture and current")
    ver.add_argument("--rounds", type=int, default=3, help="re-checks of differences while the source moves")
    ver.add_argument("--config")
    ver.set_defaults(func=_verify)

    faults = sub.add_parser("faults", help="fault injection under a steady workload, then verify (bounded)")
    faults.add_argument("--profile", default="dev", help="the local stack to break (dev or test)")
    faults.add_argument(
        "--faults",
        default="all",
        help="comma-separated: capture_kill, broker_restart, postgres_restart, spark_kill, bad_records, "
        "retention (or all)",
    )
    faults.add_argument("--capture-kills", type=int, default=3, help="SIGKILLs of capture in its fault")
    faults.add_argument("--rate", type=float, default=20.0, help="shop workload transactions per second")
    faults.add_argument("--seed", type=int, default=1)
    faults.add_argument("--workdir", default=".cdc/faults", help="config, lake and logs of the run")
    faults.set_defaults(func=_faults)

    cur = sub.add_parser("current", help="apply the changelog to tables' current state (a Dagster run each)")
    cur.add_argument("tables", nargs="*", help="source.schema.table … (or --all)")
    cur.add_argument("--all", action="store_true", help="every configured table")
    cur.add_argument("--config")
    cur.set_defaults(func=_current)

    demo = sub.add_parser("demo", help="the demo databases and workloads")
    demo_sub = demo.add_subparsers(dest="action", required=True)
    setup = demo_sub.add_parser("setup", help="create the shop schema and the pgbench tables (idempotent)")
    setup.add_argument("--profile", default="dev")
    setup.add_argument("--pgbench-scale", type=int, default=1)
    setup.set_defaults(func=_demo_setup)
    shot = demo_sub.add_parser("screenshot", help="a PNG of the running demo UI (headless chromium)")
    shot.add_argument(
        "--url", default="http://127.0.0.1:3000/locations/cdc_platform/asset-groups/shop_customers/lineage"
    )
    shot.add_argument("--out", default="docs/demo-ui.png")
    shot.set_defaults(func=_demo_screenshot)
    load = demo_sub.add_parser("load", help="run the shop OLTP workload (inserts, updates, deletes)")
    load.add_argument("--profile", default="dev")
    load.add_argument("--rate", type=float, default=10.0, help="transactions per second")
    load.add_argument("--seconds", type=float, default=60.0, help="how long; 0 = until interrupted")
    load.add_argument("--seed", type=int, default=None)
    load.set_defaults(func=_demo_load)
    bench = demo_sub.add_parser("pgbench", help="run pgbench's TPC-B-like workload on the bench database")
    bench.add_argument("--profile", default="dev")
    bench.add_argument("--seconds", type=int, default=30)
    bench.add_argument("--clients", type=int, default=2)
    bench.add_argument("--rate", type=int, default=0, help="target tps (0 = as fast as possible)")
    bench.set_defaults(func=_demo_pgbench)
    return parser


def _dev(args: argparse.Namespace) -> int:
    from cdc_platform.devstack import StackError, stack_down, stack_status, stack_up

    prof = _profile(args.profile)
    if args.action == "up":
        try:
            result = stack_up(prof)
        except StackError as exc:
            raise CliError(str(exc)) from None
        for name, started in (
            ("postgres", result.started_postgres),
            ("kafka", result.started_kafka),
            ("mariadb", result.started_mariadb),
        ):
            print(f"{name}: {'started' if started else 'already running'}")
        print(f"secrets for this stack: {prof.env_file} (source it: set -a; . {prof.env_file}; set +a)")
    elif args.action == "down":
        stopped = stack_down(prof)
        print("stopped: " + (", ".join(stopped) if stopped else "nothing (nothing of ours was running)"))
    else:
        for name, state in stack_status(prof).items():
            print(f"{name}: {state}")
    return 0


def _profile(name: str) -> StackProfile:
    from cdc_platform.devstack import profile

    try:
        return profile(name)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _config_check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    print(f"ok: {len(config.sources)} source(s), {len(config.tables)} table(s)")
    for table in config.tables:
        key = ", ".join(table.primary_key) if table.primary_key else "(from the source's primary key)"
        print(
            f"  {table.key:40s} topic={config.topic_for(table)} key={key} "
            f"window={table.changelog.window} compatibility={table.compatibility.value} "
            f"errors.tolerance={table.errors.tolerance.value}"
        )
    return 0


def _pick_source(config: PlatformConfig, name: str | None) -> str:
    if name:
        if name not in config.sources:
            raise CliError(f"no source '{name}' in the config; sources: {', '.join(sorted(config.sources))}")
        return name
    if len(config.sources) == 1:
        return next(iter(config.sources))
    raise CliError(f"the config has several sources; choose one with --source ({', '.join(sorted(config.sources))})")


def _capture_run(args: argparse.Namespace) -> int:
    import logging
    import signal
    from pathlib import Path

    from cdc_platform.capture.errors import CaptureError, SlotLostError
    from cdc_platform.capture.postgres import CaptureOptions, PostgresCapture

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args.config)
    source = _pick_source(config, args.source)
    if config.is_polled_source(source):
        return _poll_run(config, source, args)
    options = CaptureOptions(
        until_caught_up=args.until_caught_up,
        give_up_after_s=120.0 if args.until_caught_up else None,
        status_file=Path(args.status_file) if args.status_file else None,
        new_slot=args.new_slot,
    )
    capture = PostgresCapture(config, source, options)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: capture.stop())
    try:
        stats = capture.run()
    except SlotLostError as exc:
        print(f"error [{exc.reason}]: {exc}", file=sys.stderr)
        return 3
    except CaptureError as exc:
        raise CliError(str(exc)) from None
    print(json.dumps(stats.as_dict()))
    return 0


def _poll_run(config: PlatformConfig, source: str, args: argparse.Namespace) -> int:
    import signal
    from pathlib import Path

    from cdc_platform.capture.errors import CaptureError
    from cdc_platform.capture.jdbc import PollingCapture, PollOptions

    options = PollOptions(
        until_caught_up=args.until_caught_up,
        give_up_after_s=120.0 if args.until_caught_up else None,
        status_file=Path(args.status_file) if args.status_file else None,
    )
    poller = PollingCapture(config, source, options)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: poller.stop())
    try:
        stats = poller.run()
    except CaptureError as exc:
        raise CliError(str(exc)) from None
    print(json.dumps(stats.as_dict()))
    return 0


def _capture_status(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from cdc_platform.capture.jdbc import read_stored_cursors
    from cdc_platform.capture.postgres import slot_status

    config = load_config(args.config)
    source = _pick_source(config, args.source)
    if config.is_polled_source(source):
        cursors = {table: asdict(cursor) for table, cursor in read_stored_cursors(config, source).items()}
        print(json.dumps({"source": source, "kind": "jdbc", "cursors": cursors}, indent=2))
        return 0
    print(json.dumps(slot_status(config, source), indent=2))
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    from cdc_platform.orchestration import start_generations

    config = load_config(args.config)
    tables = _selected_tables(config, args.tables, args.all)
    failed = 0
    for run in start_generations(config, tables, reason=args.reason, if_missing=args.if_missing):
        state = f"{run.rows} rows" if run.success else "FAILED (see the run in the Dagster UI)"
        print(f"{run.table}: generation {run.generation}: {state} (run {run.run_id})")
        failed += not run.success
    return 1 if failed else 0


def _rehydrate(args: argparse.Namespace) -> int:
    from cdc_platform.orchestration import apply_current, start_generations

    config = load_config(args.config)
    tables = _selected_tables(config, args.tables, args.all)
    failed = 0
    done = []
    for run in start_generations(config, tables, reason="manual"):
        state = f"{run.rows} rows" if run.success else "FAILED (see the run in the Dagster UI)"
        print(f"{run.table}: generation {run.generation} (reason manual): {state} (run {run.run_id})")
        failed += not run.success
        if run.success:
            done.append(config.table(run.table))
    for table, success, run_id in apply_current(config, done):
        print(f"{table}: current {'rebuilt' if success else 'FAILED (see the run in the Dagster UI)'} (run {run_id})")
        failed += not success
    return 1 if failed else 0


def _verify(args: argparse.Namespace) -> int:
    from cdc_platform.spark.session import get_spark_session
    from cdc_platform.spark.verify import format_verdicts, verify_table

    config = load_config(args.config)
    tables = _selected_tables(config, args.tables, not args.tables)
    spark = get_spark_session(config.spark, "cdc_platform_verify")
    verdicts = [
        verify_table(spark, config, t, args.timeout, args.rounds, log=lambda m: print(m, file=sys.stderr))
        for t in tables
    ]
    print(format_verdicts(verdicts))
    return 0 if all(v.ok for v in verdicts) else 1


def _faults(args: argparse.Namespace) -> int:
    import shutil
    from pathlib import Path

    from cdc_platform.config.model import SparkConfig
    from cdc_platform.faults import FAULTS, FaultSuite, format_results
    from cdc_platform.spark.session import get_spark_session

    chosen = list(FAULTS) if args.faults == "all" else [f.strip() for f in args.faults.split(",")]
    unknown = [f for f in chosen if f not in FAULTS]
    if unknown:
        raise CliError(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    suite = FaultSuite(_profile(args.profile), workdir, get_spark_session(SparkConfig()), args.rate, args.seed)
    try:
        suite.setup()
        results = suite.run(chosen, capture_kills=args.capture_kills)
    finally:
        suite.teardown()
    print(format_results(results))
    return 0 if all(r.recovered for r in results) else 1


def _selected_tables(config: PlatformConfig, names: list[str], all_tables: bool) -> list[TableConfig]:
    if all_tables == bool(names):
        raise CliError("name tables (source.schema.table …) or use --all")
    try:
        return list(config.tables) if all_tables else [config.table(name) for name in names]
    except KeyError as exc:
        raise CliError(str(exc.args[0])) from None


def _current(args: argparse.Namespace) -> int:
    from cdc_platform.orchestration import apply_current

    config = load_config(args.config)
    failed = 0
    for table, success, run_id in apply_current(config, _selected_tables(config, args.tables, args.all)):
        print(f"{table}: {'applied' if success else 'FAILED (see the run in the Dagster UI)'} (run {run_id})")
        failed += not success
    return 1 if failed else 0


def _demo_screenshot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cdc_platform.devstack.screenshot import ScreenshotError, capture_page

    try:
        capture_page(args.url, Path(args.out))
    except ScreenshotError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {args.out}")
    return 0


def _demo_setup(args: argparse.Namespace) -> int:
    from cdc_platform.demo.setup import setup_demo
    from cdc_platform.devstack.stack import load_stack_env

    prof = _profile(args.profile)
    load_stack_env(prof)
    for line in setup_demo(prof, pgbench_scale=args.pgbench_scale):
        print(line)
    return 0


def _demo_load(args: argparse.Namespace) -> int:
    from cdc_platform.demo.workload import run_workload
    from cdc_platform.devstack.stack import load_stack_env

    prof = _profile(args.profile)
    load_stack_env(prof)
    stats = run_workload(prof, rate=args.rate, seconds=args.seconds, seed=args.seed, log=print)
    print(stats.summary())
    return 0


def _demo_pgbench(args: argparse.Namespace) -> int:
    from cdc_platform.demo.setup import run_pgbench
    from cdc_platform.devstack.stack import load_stack_env

    prof = _profile(args.profile)
    load_stack_env(prof)
    return run_pgbench(prof, seconds=args.seconds, clients=args.clients, rate=args.rate)


if __name__ == "__main__":
    sys.exit(main())
