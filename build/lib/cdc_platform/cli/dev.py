"""Dev-only commands: the local stack, the demo databases and workloads, fault injection.
They live apart from the product (``cdc_platform/devtools``) and need no platform config."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cdc_platform.cli.main import CliError, command

if TYPE_CHECKING:
    from cdc_platform.devtools.stack import StackProfile


def register(sub: Any) -> None:
    dev = sub.add_parser("dev", help="the local stack (PostgreSQL, Kafka, MariaDB) under .cdc/<profile>/")
    dev_sub = dev.add_subparsers(dest="action", required=True)
    for action, helptext in (
        ("up", "start what is not running (idempotent)"),
        ("down", "stop what this stack started"),
        ("status", "show what runs"),
    ):
        p = dev_sub.add_parser(action, help=helptext)
        p.add_argument(
            "--profile", default="dev", help="dev (the demo, default), test (the test suite), serial (its serial tests)"
        )
        command(p, _dev, needs_config=False)
    _register_faults(sub)
    _register_demo(sub)


def _register_faults(sub: Any) -> None:
    faults = sub.add_parser("faults", help="fault injection under a steady workload, then verify (bounded)")
    faults.add_argument("--profile", default="dev", help="the local stack to break (dev or test)")
    faults.add_argument(
        "--engine",
        choices=("stream", "windows"),
        default="stream",
        help="how changes are applied: stream (the long-running cdc-platform apply, the demo's) or windows "
        "(Dagster runs per changelog window)",
    )
    faults.add_argument(
        "--faults",
        default="all",
        help="comma-separated: capture_kill, broker_restart, postgres_restart, bad_records, retention, and "
        "apply_kill (stream) or spark_kill (windows); or all",
    )
    faults.add_argument("--capture-kills", type=int, default=3, help="SIGKILLs of capture in its fault")
    faults.add_argument(
        "--apply-kills",
        type=int,
        default=3,
        help="random SIGKILLs of the apply in its fault (stream), plus one cut at each of two crash points",
    )
    faults.add_argument("--rate", type=float, default=20.0, help="shop workload transactions per second")
    faults.add_argument("--seed", type=int, default=1)
    faults.add_argument("--workdir", default=".cdc/faults", help="config, lake, Dagster instance and logs of the run")
    command(faults, _faults, needs_config=False)


def _register_demo(sub: Any) -> None:
    demo = sub.add_parser("demo", help="the demo databases and workloads")
    demo_sub = demo.add_subparsers(dest="action", required=True)
    setup = demo_sub.add_parser("setup", help="create the shop schema and the pgbench tables (idempotent)")
    setup.add_argument("--profile", default="dev")
    setup.add_argument("--pgbench-scale", type=int, default=1)
    command(setup, _demo_setup, needs_config=False)
    shot = demo_sub.add_parser("screenshot", help="a PNG of the running demo UI (headless chromium)")
    shot.add_argument(
        "--url", default="http://127.0.0.1:3000/locations/cdc_platform/asset-groups/shop_customers/lineage"
    )
    shot.add_argument("--out", default="docs/demo-ui.png")
    command(shot, _demo_screenshot, needs_config=False)
    load = demo_sub.add_parser("load", help="run the shop OLTP workload (inserts, updates, deletes)")
    load.add_argument("--profile", default="dev")
    load.add_argument("--rate", type=float, default=10.0, help="transactions per second")
    load.add_argument("--seconds", type=float, default=60.0, help="how long; 0 = until interrupted")
    load.add_argument("--seed", type=int, default=None)
    command(load, _demo_load, needs_config=False)
    bench = demo_sub.add_parser("pgbench", help="run pgbench's TPC-B-like workload on the bench database")
    bench.add_argument("--profile", default="dev")
    bench.add_argument("--seconds", type=int, default=30)
    bench.add_argument("--clients", type=int, default=2)
    bench.add_argument("--rate", type=int, default=0, help="target tps (0 = as fast as possible)")
    command(bench, _demo_pgbench, needs_config=False)


def _profile(name: str) -> StackProfile:
    from cdc_platform.devtools.stack import profile

    try:
        return profile(name)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _dev(args: argparse.Namespace) -> int:
    from cdc_platform.devtools.stack import StackError, stack_down, stack_status, stack_up

    prof = _profile(args.profile)
    if args.action == "up":
        try:
            result = stack_up(prof)
        except StackError as exc:
            raise CliError(str(exc)) from None
        for name, started in (
            ("postgres", result.started_postgres), ("kafka", result.started_kafka), ("mariadb", result.started_mariadb)
        ):  # fmt: skip
            print(f"{name}: {'started' if started else 'already running'}")
        print(f"secrets for this stack: {prof.env_file} (source it: set -a; . {prof.env_file}; set +a)")
    elif args.action == "down":
        stopped = stack_down(prof)
        print("stopped: " + (", ".join(stopped) if stopped else "nothing (nothing of ours was running)"))
    else:
        for name, state in stack_status(prof).items():
            print(f"{name}: {state}")
    return 0


def _faults(args: argparse.Namespace) -> int:
    import shutil
    from pathlib import Path

    from cdc_platform.devtools.faults import FAULTS, FaultSuite, format_results

    known = FAULTS[args.engine]
    chosen = list(known) if args.faults == "all" else [f.strip() for f in args.faults.split(",")]
    unknown = [f for f in chosen if f not in known]
    if unknown:
        named = ", ".join(unknown)
        raise CliError(f"unknown fault(s) {named} for the {args.engine} engine; choose from {', '.join(known)}")
    workdir = Path(args.workdir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    suite = FaultSuite(_profile(args.profile), workdir, args.rate, args.seed, engine=args.engine)
    try:
        suite.setup()
        results = suite.run(chosen, capture_kills=args.capture_kills, apply_kills=args.apply_kills)
    finally:
        suite.teardown()
    print(format_results(results))
    return 0 if all(r.recovered for r in results) else 1


def _demo_screenshot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cdc_platform.devtools.screenshot import ScreenshotError, capture_page

    try:
        capture_page(args.url, Path(args.out))
    except ScreenshotError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {args.out}")
    return 0


def _demo_setup(args: argparse.Namespace) -> int:
    from cdc_platform.devtools.demo.setup import setup_demo
    from cdc_platform.devtools.stack.stack import load_stack_env

    prof = _profile(args.profile)
    load_stack_env(prof)
    for line in setup_demo(prof, pgbench_scale=args.pgbench_scale):
        print(line)
    return 0


def _demo_load(args: argparse.Namespace) -> int:
    from cdc_platform.devtools.demo.workload import run_workload
    from cdc_platform.devtools.stack.stack import load_stack_env

    prof = _profile(args.profile)
    load_stack_env(prof)
    stats = run_workload(prof, rate=args.rate, seconds=args.seconds, seed=args.seed, log=print)
    print(stats.summary())
    return 0


def _demo_pgbench(args: argparse.Namespace) -> int:
    from cdc_platform.devtools.demo.setup import run_pgbench
    from cdc_platform.devtools.stack.stack import load_stack_env

    prof = _profile(args.profile)
    load_stack_env(prof)
    return run_pgbench(prof, seconds=args.seconds, clients=args.clients, rate=args.rate)
