"""``capture run`` and ``capture status``: one source's long-running capture (logical
decoding, or polling), like a Kafka Connect worker."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Any

from cdc_platform.cli.main import CliError, Loaded, command, configure_process_logging
from cdc_platform.config import PlatformConfig


def register(sub: Any) -> None:
    capture = sub.add_parser("capture", help="changes into Kafka: PostgreSQL logical decoding, or polling")
    capture_sub = capture.add_subparsers(dest="action", required=True)
    run = capture_sub.add_parser("run", help="stream changes (until stopped, or --until-caught-up)")
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
    command(run, capture_run)
    status = capture_sub.add_parser("status", help="where capture stands (the slot, or a jdbc source's cursors)")
    status.add_argument("--source")
    command(status, capture_status)


def pick_source(config: PlatformConfig, name: str | None) -> str:
    if name:
        if name not in config.sources:
            raise CliError(f"no source '{name}' in the config; sources: {', '.join(sorted(config.sources))}")
        return name
    if len(config.sources) == 1:
        return next(iter(config.sources))
    raise CliError(f"the config has several sources; choose one with --source ({', '.join(sorted(config.sources))})")


def capture_run(args: argparse.Namespace, loaded: Loaded) -> int:
    from cdc_platform.sources import CaptureSettings, open_source

    configure_process_logging()
    source = open_source(loaded.config, pick_source(loaded.config, args.source))
    settings = CaptureSettings(
        until_caught_up=args.until_caught_up,
        give_up_after_s=120.0 if args.until_caught_up else None,
        status_file=Path(args.status_file) if args.status_file else None,
        new_slot=args.new_slot,
    )
    capture = source.capture(settings)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: capture.stop())
    stats = capture.run()
    as_dict = getattr(stats, "as_dict", None)
    print(json.dumps(as_dict() if as_dict else {}))
    return 0


def capture_status(args: argparse.Namespace, loaded: Loaded) -> int:
    from cdc_platform.sources import open_source

    source = open_source(loaded.config, pick_source(loaded.config, args.source))
    print(json.dumps(source.status(), indent=2, default=str))
    return 0
