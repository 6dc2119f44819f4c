"""Configuration: the YAML file users write, validated by pydantic."""

from cdc_platform.config.loader import CONFIG_ENV, ConfigError, default_config_path, load_config
from cdc_platform.config.model import (
    CompatibilityMode,
    ErrorTolerance,
    JdbcSource,
    KafkaConfig,
    PlatformConfig,
    PollConfig,
    PostgresSource,
    TableConfig,
)
from cdc_platform.model.errors import MissingSecretError

__all__ = [
    "CONFIG_ENV",
    "CompatibilityMode",
    "ConfigError",
    "ErrorTolerance",
    "JdbcSource",
    "KafkaConfig",
    "MissingSecretError",
    "PlatformConfig",
    "PollConfig",
    "PostgresSource",
    "TableConfig",
    "default_config_path",
    "load_config",
]
