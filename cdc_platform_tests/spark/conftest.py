"""One local Spark session for the Spark tests (getOrCreate would share it anyway)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_platform.config.model import SparkConfig
from cdc_platform.spark.session import get_spark_session


@pytest.fixture(scope="session")
def spark() -> Any:
    return get_spark_session(SparkConfig(master="local[2]"))
