"""The parser and the dispatch: every command that needs the config gets it loaded from
``--config`` (given before or after the command) before it runs."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cdc_platform.config import ConfigError, PlatformConfig, default_config_path, load_config
from cdc_platform.model.errors import CdcError

EXIT_POSITION_LOST = 3


class CliError(RuntimeError):
    """An expected failure with a message for the user (no traceback)."""


@dataclass(frozen=True)
class Loaded:
    """The config a command runs with, and where it came from."""

    path: Path
    config: PlatformConfig


Command = Callable[[argparse.Namespace, Loaded], int]


# Loggers whose INFO lines tell a long-running process's reader nothing: the Dagster
# instance the apply reports to runs alembic's schema check each time it is opened, a
# dozen "setup plugin" / "Context impl SQLiteImpl" lines at every start.
QUIET_LOGGERS = ("alembic",)


def configure_process_logging() -> None:
    """INFO with timestamps for a long-running process (capture, apply); known noise at WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "needs_config", False):
            path = Path(args.config) if args.config else default_config_path()
            return int(args.func(args, Loaded(path.resolve(), load_config(path))) or 0)
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except CdcError as exc:
        print(f"error [{exc.reason or exc.kind}]: {exc}", file=sys.stderr)
        return EXIT_POSITION_LOST if exc.reason == "source_position_lost" else 1


def build_parser() -> argparse.ArgumentParser:
    from cdc_platform.cli import apply, capture, dev, pipeline

    parser = argparse.ArgumentParser(prog="cdc-platform", description="Change-data-capture into a Delta lake.")
    parser.add_argument("--config", help="config file (default: $CDC_PLATFORM_CONFIG or ./cdc_platform.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (pipeline, capture, apply, dev):
        module.register(sub)
    return parser


def config_option(parser: argparse.ArgumentParser) -> None:
    """``--config`` after the command too (it wins over one given before it)."""
    parser.add_argument("--config", default=argparse.SUPPRESS, help="config file (also accepted before the command)")


def command(parser: argparse.ArgumentParser, func: Callable[..., int], needs_config: bool = True) -> None:
    if needs_config:
        config_option(parser)
    parser.set_defaults(func=func, needs_config=needs_config)
