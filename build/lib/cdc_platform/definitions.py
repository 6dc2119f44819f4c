"""The Dagster code location, built lazily from the config file.

``$CDC_PLATFORM_CONFIG`` names the file (default ./cdc_platform.yaml). Nothing is built
at import: Dagster calls ``defs`` when it loads the location, and a bad file fails the
load with the same message ``cdc-platform config check`` prints.
"""

from __future__ import annotations

import dagster as dg

from cdc_platform.config import default_config_path
from cdc_platform.orchestration.definitions import build_definitions


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions(default_config_path())
