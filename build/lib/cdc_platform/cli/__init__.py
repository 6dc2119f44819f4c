"""``cdc-platform``: the command line. Loads ``--config`` first; builds Dagster
definitions only for the commands that start runs."""

from cdc_platform.cli.main import main

__all__ = ["main"]
