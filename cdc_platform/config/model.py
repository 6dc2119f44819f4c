"""The platform's configuration: sources, Kafka, lake, Spark and tables.

Pure pydantic, no Dagster. Every model forbids unknown keys, so a typo is an error and
not a silently ignored setting. Secrets are never values in the file: they are names of
environment variables (``password_env``), resolved at use time into ``SecretStr``.
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    StringConstraints,
    Tag,
    field_validator,
    model_validator,
)

from cdc_platform.config.producers import DebeziumProducer, PlatformProducer
from cdc_platform.envelope.encoding import ValueEncoding
from cdc_platform.model.errors import MissingSecretError
from cdc_platform.model.leases import DEFAULT_GROUP as DEFAULT_APPLY_GROUP

# Postgres identifiers as they appear in config: either plain (letters, digits, _, $) or
# anything in double quotes ("Order Items"). Quoting is preserved to the SQL layer.
_IDENT = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
TABLE_NAME_RE = re.compile(rf"^(?P<source>[a-z][a-z0-9_]*)\.(?P<schema>{_IDENT})\.(?P<table>{_IDENT})$")
ENV_VAR_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"

EnvVarName = Annotated[str, StringConstraints(pattern=ENV_VAR_RE)]
SourceName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$", max_length=40)]

# Option keys whose values are secrets; they must come from the environment.
SECRET_OPTION_RE = re.compile(r"(password|secret|jaas\.config|token|key\.pem|credential)", re.IGNORECASE)


def read_secret(env_var: str, field_path: str) -> SecretStr:
    """Read a secret from the environment; the message names the variable, never a value."""
    value = os.environ.get(env_var)
    if value is None or value == "":
        raise MissingSecretError(
            f"environment variable {env_var} is not set (named by {field_path}); "
            f"export {env_var}=<secret> before running (the dev stack writes it to .cdc/<profile>/env)"
        )
    return SecretStr(value)


def _refuse_plain_password(data: object) -> object:
    if isinstance(data, dict) and "password" in data:
        raise ValueError(
            "a plain-text password is not allowed here; remove 'password' and set "
            "'password_env: SOME_ENV_VAR', then export SOME_ENV_VAR"
        )
    return data


def _source_kind(data: Any) -> str:
    """``kind`` may be left out for PostgreSQL sources (the first kind, so older files stay valid)."""
    if isinstance(data, dict):
        return str(data.get("kind", "postgres"))
    return str(getattr(data, "kind", "postgres"))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class CompatibilityMode(StrEnum):
    """Schema-registry style compatibility of a table's schema history."""

    BACKWARD = "BACKWARD"
    FORWARD = "FORWARD"
    FULL = "FULL"
    NONE = "NONE"


class ErrorTolerance(StrEnum):
    """Kafka Connect's ``errors.tolerance``: stop on a bad record, or dead-letter it."""

    NONE = "none"
    ALL = "all"


class ApplyEngine(StrEnum):
    """How a source's changes reach the lake (README "Applying changes")."""

    WINDOWS = "windows"  # one Dagster run per changelog window, then one per current update
    STREAM = "stream"  # one Spark application per source: ``cdc-platform apply`` (continuous or --once)


class ApplyConfig(_Strict):
    """How the source's changes are applied to its tables' changelog and current state."""

    engine: ApplyEngine = Field(
        default=ApplyEngine.STREAM,
        description="stream (default): one Spark application per source (cdc-platform apply, or the Dagster job "
        "<source>__apply_job on apply.schedule) reads every table topic from current's frontier, appends each "
        "micro-batch to the changelog (one partition per day) and merges it into current; windows: a Dagster run "
        "per changelog window and per current update (a partition per window: 8 760 a year at 1h).",
    )
    trigger_interval_s: float = Field(
        default=2.0, gt=0, le=3600, description="stream: pause between micro-batches when the topics are idle."
    )
    min_batch_interval_s: float = Field(
        default=0.0,
        ge=0,
        le=86_400,
        description="stream, continuous mode: a table's next micro-batch starts no sooner than this after its "
        "previous one started (Spark's processingTime trigger). 0: as soon as it is done, fresh within seconds. "
        "Each micro-batch pays a fixed cost of a few Spark jobs and Delta commits, so tables that may lag (or a "
        "driver shared by hundreds of tables) get fewer, larger batches and a bounded share of the driver.",
    )
    max_offsets_per_batch: int = Field(
        default=200_000, ge=1000, description="stream: at most this many Kafka offsets per table per micro-batch."
    )
    schedule: str | None = Field(
        default=None,
        pattern=r"^\S+( \S+){4}$",
        description="stream, scheduled mode: a cron schedule (5 fields, UTC) on which the Dagster job "
        "<source>__apply_job applies everything available and stops; unset: run `cdc-platform apply` continuously.",
    )
    parallelism: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="stream: tables whose micro-batches are applied at once (Spark runs their jobs side by side). "
        "Default: the machine's cores, at least 2 (on 2 cores, 2 beat 4: the Spark driver is the limit).",
    )

    decoder: Literal["auto", "jvm", "python"] = Field(
        default="auto",
        description="How Kafka records become change rows. jvm: Spark's Kafka source and Spark SQL (records Spark "
        "SQL cannot decode exactly still go to the Python decoder, one by one); python: every record read and "
        "decoded in Spark's Python workers (confluent-kafka); auto: jvm when the Kafka client needs no settings "
        "beyond bootstrap_servers (Spark's Kafka client takes Java properties, not librdkafka's), else python.",
    )

    def tables_at_once(self) -> int:
        return self.parallelism or max(2, os.cpu_count() or 2)


class PostgresSource(_Strict):
    """A PostgreSQL database captured by logical decoding (pgoutput)."""

    kind: Literal["postgres"] = "postgres"
    host: str = "127.0.0.1"
    port: int = Field(default=5432, ge=1, le=65535)
    database: str = Field(min_length=1)
    user: str = Field(min_length=1)
    password_env: EnvVarName = Field(
        description="Name of the environment variable holding the password (never the password itself)."
    )
    slot_name: str | None = Field(
        default=None, pattern=r"^[a-z0-9_]{1,63}$", description="Replication slot; default cdc_<source>."
    )
    publication: str | None = Field(
        default=None, pattern=r"^[a-z0-9_]{1,63}$", description="Publication; default cdc_<source>."
    )
    topic_prefix: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Kafka topic prefix (Debezium's topic.prefix); default: the source name.",
    )
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    signal_table: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$",
        description=(
            "schema.table of a Debezium-style signal table (id, type, data) the rehydration sensor reads; "
            "a row ('<id>', 'rehydrate', 'public.orders') asks for a new generation of that table."
        ),
    )
    envelope_schemas: bool = Field(
        default=False, description="Embed Kafka Connect schemas in keys and values (JsonConverter schemas.enable)."
    )
    decimal_handling: Literal["precise", "string"] = "precise"
    interval_handling: Literal["string", "numeric"] = "string"
    connect_options: dict[str, str] = Field(
        default_factory=dict, description="libpq options passed through, e.g. sslmode, connect_timeout."
    )
    producer: Annotated[PlatformProducer | DebeziumProducer, Field(discriminator="kind")] = Field(
        default_factory=PlatformProducer,
        description="Who writes the topics: the platform's capture, or a Debezium connector (kind: debezium).",
    )
    apply: ApplyConfig = Field(default_factory=ApplyConfig)

    @model_validator(mode="before")
    @classmethod
    def _no_plain_password(cls, data: object) -> object:
        return _refuse_plain_password(data)

    @model_validator(mode="after")
    def _lake_reads_what_is_written(self) -> PostgresSource:
        if self.interval_handling == "numeric":
            raise ValueError(
                "interval_handling: numeric is not read by the lake (snapshots and changes hold intervals "
                "as ISO 8601 text, e.g. 'P3DT11H'); remove it or set interval_handling: string"
            )
        if not isinstance(self.producer, DebeziumProducer):
            return self
        capture_only = sorted({"decimal_handling", "interval_handling", "envelope_schemas"} & self.model_fields_set)
        if capture_only:
            raise ValueError(
                f"{', '.join(capture_only)} configure the platform's capture, which does not write this source's "
                "topics (producer: debezium); set Debezium's own setting under producer.settings instead"
            )
        for field, key in (("slot_name", "slot.name"), ("publication", "publication.name"),
                           ("topic_prefix", "topic.prefix")):  # fmt: skip
            ours, theirs = getattr(self, field), self.producer.settings.get(key)
            if ours and theirs and ours != theirs:
                raise ValueError(
                    f"{field} '{ours}' and producer.settings {key} '{theirs}' differ; they name the connector's "
                    f"{key}: keep one, or make them equal"
                )
        return self

    def slot(self, source_name: str) -> str:
        """The replication slot whose position is this source's (Debezium's own when it produces)."""
        if isinstance(self.producer, DebeziumProducer):
            return self.slot_name or self.producer.setting("slot.name")
        return self.slot_name or f"cdc_{source_name}"

    def publication_name(self, source_name: str) -> str:
        if isinstance(self.producer, DebeziumProducer):
            return self.publication or self.producer.setting("publication.name")
        return self.publication or f"cdc_{source_name}"

    def prefix(self, source_name: str) -> str:
        if isinstance(self.producer, DebeziumProducer):
            return self.topic_prefix or self.producer.settings.get("topic.prefix") or source_name
        return self.topic_prefix or source_name

    def value_encoding(self) -> ValueEncoding:
        if isinstance(self.producer, DebeziumProducer):
            return self.producer.encoding()
        return ValueEncoding(decimal=self.decimal_handling)

    @field_validator("connect_options")
    @classmethod
    def _no_secret_options(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if SECRET_OPTION_RE.search(key):
                raise ValueError(
                    f"'{key}' is a secret and may not be written in the file; use password_env for the "
                    "password (other secrets: a libpq service file or PGSSLKEY paths)"
                )
        return value

    def password(self, source_name: str) -> SecretStr:
        return read_secret(self.password_env, f"sources.{source_name}.password_env")

    def conninfo(self, source_name: str, application_name: str) -> str:
        """libpq connection string, password included: never log it or put it in metadata."""
        from psycopg.conninfo import make_conninfo

        options = {"connect_timeout": "10", **self.connect_options}
        return make_conninfo(
            "",
            **options,
            host=self.host,
            port=self.port,
            dbname=self.database,
            user=self.user,
            password=self.password(source_name).get_secret_value(),
            application_name=application_name,
        )


class JdbcSource(_Strict):
    """A database read by polling queries (query-based capture): for databases without a
    usable replication feed. MariaDB and MySQL (``dialect``) through PyMySQL for polling
    and Spark JDBC (MariaDB Connector/J) for snapshots.

    Polling cannot see hard deletes: use a soft-delete column (``poll.soft_delete_column``)
    and/or periodic reconciliation generations (``poll.reconcile_every``)."""

    kind: Literal["jdbc"]
    dialect: Literal["mariadb", "mysql"] = "mariadb"
    host: str = "127.0.0.1"
    port: int = Field(default=3306, ge=1, le=65535)
    database: str = Field(min_length=1, description="The database the poller connects to.")
    user: str = Field(min_length=1)
    password_env: EnvVarName = Field(
        description="Name of the environment variable holding the password (never the password itself)."
    )
    topic_prefix: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Kafka topic prefix; default: the source name.",
    )
    poll_interval_s: float = Field(default=5.0, gt=0, le=3600, description="Pause between polls of a table.")
    batch_size: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Most rows read per query (the cursor then moves on)."
    )
    connect_timeout_s: int = Field(default=10, ge=1, le=600)
    apply: ApplyConfig = Field(default_factory=ApplyConfig)
    decimal_handling: Literal["precise", "string"] = "precise"

    @model_validator(mode="before")
    @classmethod
    def _no_plain_password(cls, data: object) -> object:
        return _refuse_plain_password(data)

    def prefix(self, source_name: str) -> str:
        return self.topic_prefix or source_name

    def value_encoding(self) -> ValueEncoding:
        return ValueEncoding(decimal=self.decimal_handling)

    def password(self, source_name: str) -> SecretStr:
        return read_secret(self.password_env, f"sources.{source_name}.password_env")


SourceConfig = Annotated[
    Annotated[PostgresSource, Tag("postgres")] | Annotated[JdbcSource, Tag("jdbc")], Discriminator(_source_kind)
]

PollMode = Literal["incrementing", "timestamp", "timestamp+incrementing"]


class PollConfig(_Strict):
    """How a table of a ``jdbc`` source is polled (Kafka Connect JDBC source's modes)."""

    mode: PollMode = Field(
        description=(
            "incrementing: new rows by a strictly increasing column (updates are not seen); timestamp: rows "
            "whose timestamp column moved past the cursor; timestamp+incrementing: both as one compound "
            "cursor, so rows sharing a timestamp are never skipped (the safe choice)."
        )
    )
    incrementing_column: str | None = Field(default=None, min_length=1)
    timestamp_column: str | None = Field(default=None, min_length=1)
    timestamp_delay_s: float = Field(
        default=0.0,
        ge=0,
        description=(
            "Read only rows whose timestamp is at least this old, so transactions still open when a poll "
            "runs are not passed by the cursor (Kafka Connect's timestamp.delay.interval.ms)."
        ),
    )
    soft_delete_column: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "A row whose value here is set (non-NULL, and not 0 for numeric/boolean columns) is published as a "
            "delete ('d') and left out of snapshots."
        ),
    )
    initial: Literal["earliest", "latest"] = Field(
        default="earliest",
        description=(
            "Where a table without a stored cursor starts: earliest publishes every row once (safe with any "
            "generation), latest starts at the newest row (take a generation after the first poll)."
        ),
    )
    reconcile_every: str | None = Field(
        default=None,
        pattern=r"^[1-9][0-9]*[mhd]$",
        description=(
            "Take a new snapshot generation when the latest is older than this (e.g. 6h): polling cannot see "
            "hard deletes, a generation drops rows that no longer exist."
        ),
    )

    @model_validator(mode="after")
    def _columns_for_mode(self) -> PollConfig:
        if "incrementing" in self.mode and not self.incrementing_column:
            raise ValueError(f"mode '{self.mode}' needs incrementing_column (a strictly increasing integer column)")
        if "timestamp" in self.mode and not self.timestamp_column:
            raise ValueError(
                f"mode '{self.mode}' needs timestamp_column (a datetime/timestamp column set on every insert "
                "and update, e.g. updated_at ... ON UPDATE CURRENT_TIMESTAMP(6))"
            )
        if self.mode == "incrementing" and self.timestamp_column:
            raise ValueError("timestamp_column is not used in mode 'incrementing'; use 'timestamp+incrementing'")
        return self

    def reconcile_every_s(self) -> float | None:
        if self.reconcile_every is None:
            return None
        n, unit = int(self.reconcile_every[:-1]), self.reconcile_every[-1]
        return n * {"m": 60, "h": 3600, "d": 86400}[unit]


class KafkaConfig(_Strict):
    """The Kafka cluster the change events go through."""

    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port…]")
    options: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka client properties passed through (security.protocol, sasl.mechanism, ssl.*…).",
    )
    secret_options_env: dict[str, EnvVarName] = Field(
        default_factory=dict,
        description="librdkafka properties whose values are secrets, mapped to environment variable names.",
    )
    partitions: int = Field(default=3, ge=1, le=10_000)
    replication_factor: int = Field(default=1, ge=1, le=32)
    cleanup_policy: Literal["compact", "delete", "compact,delete"] = "compact"

    @field_validator("options")
    @classmethod
    def _no_plain_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if SECRET_OPTION_RE.search(key):
                raise ValueError(
                    f"'{key}' is a secret and may not be written in plain text; move it to "
                    f"kafka.secret_options_env as '{key}: SOME_ENV_VAR' and export SOME_ENV_VAR"
                )
        return value

    def client_config(self, resolve_secrets: bool = True) -> dict[str, str | int | float | bool]:
        """librdkafka config with secrets resolved (unless ``resolve_secrets=False``: then
        without them). Never log or return this to a UI."""
        config: dict[str, str | int | float | bool] = {"bootstrap.servers": self.bootstrap_servers, **self.options}
        for key, env_var in self.secret_options_env.items() if resolve_secrets else ():
            config[key] = read_secret(env_var, f"kafka.secret_options_env.{key}").get_secret_value()
        return config


# a lake on a local disk (a path or file://) or on an S3-compatible store (Hadoop's S3A)
LAKE_SCHEMES = ("file", "s3a")


class S3Config(_Strict):
    """An S3-compatible store for a lake whose root is ``s3a://bucket/prefix``: AWS S3 with its
    defaults, or any store that speaks S3 (an endpoint of its own, usually path-style). Spark
    reaches it through Hadoop's S3A, delta-rs (the ledger, the driver's merges) through its own
    client; both are configured from here, so the two never disagree."""

    endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[^/\s]+/?$",
        description="e.g. http://127.0.0.1:9444 for a store of your own; unset: AWS S3 in `region`",
    )
    region: str = Field(default="us-east-1", min_length=1)
    path_style: bool = Field(
        default=False,
        description="true: http://endpoint/bucket/key (most S3-compatible stores); false: bucket.endpoint",
    )
    access_key_id_env: EnvVarName | None = Field(
        default=None,
        description="Environment variable holding the access key id; unset (with secret_access_key_env): the "
        "AWS default credentials (environment, profile, instance or pod role) on every process and executor",
    )
    secret_access_key_env: EnvVarName | None = Field(
        default=None, description="Environment variable holding the secret access key (never the key itself)."
    )

    @model_validator(mode="after")
    def _keys_together(self) -> S3Config:
        if (self.access_key_id_env is None) != (self.secret_access_key_env is None):
            raise ValueError(
                "set both access_key_id_env and secret_access_key_env, or neither (the AWS default credentials)"
            )
        return self


class LakeConfig(_Strict):
    """Where the Delta tables live: a local path (relative to the config file) or a URI."""

    root: str = Field(min_length=1, description="e.g. .cdc/dev/lake, /data/lake, s3a://bucket/lake")
    s3: S3Config | None = Field(
        default=None, description="The S3-compatible store of an s3a:// root (endpoint, region, credentials)."
    )
    deletion_vectors: bool = Field(
        default=True,
        description="Current and history tables use Delta deletion vectors: a MERGE marks replaced rows instead of "
        "rewriting their files (cost follows the changes). Spark, DuckDB and delta-rs' QueryBuilder read them; "
        "delta-rs' to_pyarrow_table refuses them. false: MERGEs rewrite files (a table that has them keeps them).",
    )
    driver_merge_max_rows: int | None = Field(
        default=None,
        ge=0,
        description="Currents of up to this many rows take a batch of up to 200 000 changes by delta-rs in the "
        "driver (copy on write: the files the batch touches are rewritten) instead of Spark's MERGE with deletion "
        "vectors (~2 s of fixed cost a batch on 2 cores). Raising it trades disk writes for freshness: 10k random "
        "changes into 10M rows take ~2.6 s instead of 5-8 s, but rewrite every file they touch (the old files stay "
        "until a VACUUM), and the driver holds the touched files' rows while it rewrites them. The same bound "
        "holds for history: a history of up to this many versions takes a batch of up to 10 000 changes (or one the "
        "driver holds) in the driver. Unset: 1 000 000; 0: always Spark.",
    )
    driver_batch_max_mb: int = Field(
        default=128,
        ge=0,
        description="A stream micro-batch whose decoded records are estimated to fit in this many MB is collected "
        "to the driver in one Spark job, and its statistics, changelog append (delta-rs) and latest event per key "
        "are computed there, instead of three Spark jobs over a cached frame: a 200 000-change batch of a "
        "five-column table (~60 MB) took 25-51 % less time (docs/benchmarks.md). The estimate: two images of "
        "current's rows (its Parquet footer) and the change columns, at least what the table's last such batch "
        "took. The same bound keeps what a driver merge collects (a batch's latest row per key) in the budget. "
        "The driver holds up to this much per table it applies at once (apply.parallelism), in Python and "
        "briefly in the JVM. A batch the estimate got wrong (Spark refuses its results above "
        "spark.driver.maxResultSize) goes on through Spark at once, and the table's batches stay there for 10 "
        "min. 0: Spark's jobs and MERGE for every batch.",
    )
    retain_old_files_hours: int = Field(
        default=24,
        ge=0,
        description="How long files a commit replaced stay on disk for readers of older versions (time travel, "
        "a query that started before the commit) before the stream apply's VACUUM deletes them, for current, "
        "history, the changelog and the deletes table. Also set as each table's "
        "delta.deletedFileRetentionDuration, so your own VACUUM agrees. Each batch replaces files (the driver's "
        "merge rewrites those it touches), so disk use grows with this retention times the write rate. 0 is "
        "for tests only: a reader of the version before a commit can lose its files.",
    )
    vacuum_every_minutes: float | None = Field(
        default=60,
        ge=0,
        description="How often the stream apply deletes each table's files older than retain_old_files_hours "
        "(delta-rs VACUUM in the driver, milliseconds a table on a local disk; a scheduled run does it on its "
        "first pass). null: never (run VACUUM yourself, or the lake's disk use grows with every batch).",
    )

    @property
    def on_s3(self) -> bool:
        """The lake is on an S3-compatible store (``lake.s3`` is only allowed there)."""
        return self.root.lower().startswith("s3a://")

    @model_validator(mode="after")
    def _known_store(self) -> LakeConfig:
        scheme = self.root.split("://", 1)[0].lower() if "://" in self.root else "file"
        if scheme == "s3":
            raise ValueError(f"root {self.root!r}: write s3a://… (Hadoop's S3A client; delta-rs reads it too)")
        if scheme not in LAKE_SCHEMES:
            raise ValueError(
                f"root {self.root!r}: the lake runs on a local path or an S3-compatible store (s3a://bucket/prefix); "
                f"'{scheme}://' is not supported"
            )
        if self.s3 is not None and scheme != "s3a":
            raise ValueError(f"lake.s3 is set but root {self.root!r} is not on S3; remove lake.s3 or use s3a://")
        return self


class SparkConfig(_Strict):
    master: str = Field(default="local[*]", min_length=1)
    app_name: str = "cdc_platform"
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark conf, passed through.")
    jars_dir: str | None = Field(
        default=None,
        description=(
            "Directory of the Spark-side jars (Delta Lake, JDBC drivers), relative to this file; "
            "scripts/bootstrap.sh resolves them into .cdc/jars/spark. Unset: $CDC_SPARK_JARS_DIR, "
            "else Spark downloads the pinned packages from Maven Central (spark.jars.packages)."
        ),
    )


WINDOW_RE = re.compile(r"^(?P<n>[1-9][0-9]*)(?P<unit>[mhd])$")
EVEN_PERIODS = "one of 1m 2m 5m 10m 15m 20m 30m, 1h 2h 3h 4h 6h 8h 12h, 1d"


def even_period(value: str) -> str:
    """A period that divides an hour or a day evenly (``Nm``, ``Nh``, ``1d``), or a ValueError naming the choices."""
    match = WINDOW_RE.match(value)
    if not match:
        raise ValueError(f"'{value}' is not a period; use {EVEN_PERIODS}")
    n, unit = int(match["n"]), match["unit"]
    ok = (unit == "m" and 60 % n == 0 and n < 60) or (unit == "h" and 24 % n == 0 and n < 24)
    if not (ok or (unit == "d" and n == 1)):
        raise ValueError(f"'{value}' does not divide an hour or a day evenly; use {EVEN_PERIODS}")
    return value


def period_cron(value: str) -> str:
    """The cron schedule (UTC) that ticks at the start of each period."""
    match = WINDOW_RE.match(value)
    assert match is not None  # validated by even_period
    n, unit = int(match["n"]), match["unit"]
    if unit == "m":
        return f"*/{n} * * * *" if n > 1 else "* * * * *"
    if unit == "h":
        return f"0 */{n} * * *" if n > 1 else "0 * * * *"
    return "0 0 * * *"


def period_seconds(value: str) -> int:
    match = WINDOW_RE.match(value)
    assert match is not None  # validated by even_period
    return int(match["n"]) * {"m": 60, "h": 3600, "d": 86400}[match["unit"]]


class ChangelogConfig(_Strict):
    window: str = Field(
        default="1h",
        description="Changelog partition size: Nm (N divides 60), Nh (N divides 24) or 1d.",
    )
    grace_s: float = Field(default=30.0, ge=0, description="Idle partitions close a window this long after its end.")
    start: str = Field(
        default="2026-11-01T00:00",
        pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$",
        description="First changelog window (UTC, YYYY-MM-DDTHH:MM); Dagster partitions begin here.",
    )
    partition: Literal["day", "hour"] = Field(
        default="day",
        description="stream engine: the changelog's partition (in Delta and in Dagster), one per UTC day "
        "(at most 366 a year) or per hour (8 784: smaller partitions, sealed and checked within the hour). "
        "The windows engine partitions by window.",
    )

    @field_validator("window")
    @classmethod
    def _valid_window(cls, value: str) -> str:
        return even_period(value)

    def cron_schedule(self) -> str:
        return period_cron(self.window)

    @property
    def stream_partition_s(self) -> int:
        """A streamed changelog partition's length."""
        return 3_600 if self.partition == "hour" else 86_400


class ChecksConfig(_Strict):
    every: str = Field(
        default="10m",
        description="A streamed table: how often a Dagster run evaluates current's (and history's) checks and "
        "materializes the version it checked: Nm (N divides 60), Nh (N divides 24) or 1d. Completeness reads the "
        "whole source table, so a big table may want 1h or 1d.",
    )

    fresh_within_s: float = Field(
        default=60.0,
        ge=1,
        le=86_400,
        description="A streamed table's fresh check passes while current is at most this far behind the source "
        "(the age of the newest change it holds) or caught up. Raise it for tables whose consumers can wait.",
    )

    @field_validator("every")
    @classmethod
    def _valid_every(cls, value: str) -> str:
        return even_period(value)


class ErrorsConfig(_Strict):
    tolerance: ErrorTolerance = ErrorTolerance.NONE
    dead_letter_threshold: int = Field(
        default=0,
        ge=0,
        description="Completeness check fails above this many dead letters per changelog partition (a window; a "
        "UTC day for a streamed changelog).",
    )


class CompletenessConfig(_Strict):
    max_in_flight_offsets: int = Field(
        default=200_000,
        ge=0,
        description="The completeness check compares current with the source except for the keys changed in the "
        "Kafka span it cannot pin (current's frontier and the source read to the end of the topic); it reads that "
        "span's keys, and above this many offsets it reports 'not compared' instead.",
    )


class SnapshotMode(StrEnum):
    """How a PostgreSQL generation reads the table (``lake/snapshot.py``, README "Snapshots")."""

    INCREMENTAL = "incremental"  # chunk by chunk, each in its own short transaction: no xmin horizon held
    EXPORTED = "exported"  # every chunk in one exported snapshot: one point in time, one long transaction


class SnapshotConfig(_Strict):
    mode: SnapshotMode = Field(
        default=SnapshotMode.INCREMENTAL,
        description="incremental (default): each key-range chunk is read in a transaction of its own, so vacuum "
        "is never held back longer than one chunk's read; the changes replayed from the watermark make the "
        "chunks, read at different instants, converge. exported: every chunk joins one exported snapshot (one "
        "point in time, an exact row count; the transaction stays open for the whole read; PostgreSQL). On "
        "MariaDB/MySQL each chunk is always its own read (no shared read view): exported there means one pass "
        "that does not resume.",
    )
    chunk_rows: int = Field(
        default=100_000, ge=1, description="Rows per chunk (one Spark task each); chunks are key ranges of equal size."
    )
    chunks_per_wave: int | None = Field(
        default=None,
        ge=1,
        description="Chunks per wave of an incremental generation: one Delta commit and one ledger record each, "
        "and a killed generation reads at most one wave again. Default: 16 per Spark core (fewer, smaller waves "
        "cost ~0.6 s each on two cores).",
    )


class TableConfig(_Strict):
    """One captured table: ``<source>.<schema>.<table>``."""

    name: str = Field(description="<source>.<schema>.<table>, e.g. shop.public.orders")
    primary_key: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Key columns. Omit to use the table's primary key; required for tables without one "
        "(they then need REPLICA IDENTITY FULL).",
    )
    asset_name: str | None = Field(
        default=None, pattern=r"^[a-z][a-z0-9_]*$", description="Dagster asset name; default: the table name."
    )
    topic: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,249}$")
    changelog: ChangelogConfig = Field(default_factory=ChangelogConfig)
    compatibility: CompatibilityMode = CompatibilityMode.BACKWARD
    errors: ErrorsConfig = Field(default_factory=ErrorsConfig)
    completeness: CompletenessConfig = Field(default_factory=CompletenessConfig)
    checks: ChecksConfig = Field(default_factory=ChecksConfig)
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)
    history: bool = Field(
        default=False, description="Also keep an SCD2 history table (valid_from / valid_to / is_current)."
    )
    apply_group: str = Field(
        default=DEFAULT_APPLY_GROUP,
        pattern=r"^[a-z][a-z0-9_]{0,62}$",
        description="stream engine: the tables of one source and group are applied by one process "
        "(cdc-platform apply --source S --group G). Split a big source into groups to apply it in several "
        "Spark applications; `cdc-platform apply --source S` alone applies every group of S.",
    )
    poll: PollConfig | None = Field(
        default=None, description="How the table is polled; required for (and only for) tables of jdbc sources."
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not TABLE_NAME_RE.match(value):
            raise ValueError(
                f"'{value}' is not '<source>.<schema>.<table>' (e.g. shop.public.orders; quote "
                'identifiers with spaces or capitals: shop.public."Order Items")'
            )
        return value

    @field_validator("primary_key")
    @classmethod
    def _unique_key(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"primary_key lists a column twice: {value}")
        return value

    @property
    def source(self) -> str:
        return self._parts()["source"]

    @property
    def schema_name(self) -> str:
        return _unquote(self._parts()["schema"])

    @property
    def table_name(self) -> str:
        return _unquote(self._parts()["table"])

    @property
    def key(self) -> str:
        """``source.schema.table`` with unquoted names, as users type it on the CLI."""
        return f"{self.source}.{self.schema_name}.{self.table_name}"

    @property
    def dagster_name(self) -> str:
        return self.asset_name or re.sub(r"[^a-z0-9_]+", "_", self.table_name.lower()).strip("_")

    def _parts(self) -> dict[str, str]:
        match = TABLE_NAME_RE.match(self.name)
        assert match is not None  # validated above
        return match.groupdict()


def _debezium_topics_accept_truncates(name: str, source: PostgresSource | JdbcSource, kafka: KafkaConfig) -> None:
    debezium = isinstance(source, PostgresSource) and isinstance(source.producer, DebeziumProducer)
    if debezium and "compact" in kafka.cleanup_policy:
        raise ValueError(
            f"sources.{name} is produced by Debezium, which writes truncate events without a key; a "
            f"compacted topic (kafka.cleanup_policy: {kafka.cleanup_policy}) rejects them and the connector "
            "task fails: set kafka.cleanup_policy: delete"
        )


def _stream_settings_need_stream(i: int, table: TableConfig, source: SourceConfig) -> None:
    """Settings only the stream apply reads are an error on a table applied by windows."""
    if source.apply.engine is ApplyEngine.STREAM:
        return
    if table.apply_group != DEFAULT_APPLY_GROUP:
        _stream_only(i, table, "apply_group", f"is in apply group '{table.apply_group}'")
    if table.changelog.partition != "day":
        _stream_only(i, table, "changelog.partition", f"has changelog.partition: {table.changelog.partition}")


def _stream_only(i: int, table: TableConfig, setting: str, says: str) -> None:
    raise ValueError(
        f"tables[{i}].{setting}: '{table.name}' {says}, but source '{table.source}' is applied by changelog-window "
        f"runs (apply.engine: windows); set sources.{table.source}.apply.engine: stream, or remove {setting}"
    )


def _unquote(ident: str) -> str:
    if ident.startswith('"') and ident.endswith('"'):
        return ident[1:-1].replace('""', '"')
    return ident


class PlatformConfig(_Strict):
    """The whole file."""

    sources: dict[SourceName, SourceConfig] = Field(min_length=1)
    kafka: KafkaConfig
    lake: LakeConfig
    spark: SparkConfig = Field(default_factory=SparkConfig)
    tables: list[TableConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _tables_refer_to_sources(self) -> PlatformConfig:
        seen: dict[tuple[str, str], str] = {}
        for i, table in enumerate(self.tables):
            if table.source not in self.sources:
                raise ValueError(
                    f"tables[{i}].name: source '{table.source}' is not declared under sources "
                    f"(declared: {', '.join(sorted(self.sources))})"
                )
            source = self.sources[table.source]
            _debezium_topics_accept_truncates(table.source, source, self.kafka)
            if isinstance(source, JdbcSource) and table.poll is None:
                raise ValueError(
                    f"tables[{i}].poll: '{table.name}' belongs to jdbc source '{table.source}' and needs a poll "
                    "block, e.g. poll: {mode: timestamp+incrementing, timestamp_column: updated_at, "
                    "incrementing_column: id}"
                )
            if isinstance(source, PostgresSource) and table.poll is not None:
                raise ValueError(
                    f"tables[{i}].poll: '{table.name}' belongs to postgres source '{table.source}', which is "
                    "captured by logical decoding; remove the poll block"
                )
            _stream_settings_need_stream(i, table, source)
            ident = (table.source, table.dagster_name)
            if ident in seen:
                raise ValueError(
                    f"tables[{i}].name: '{table.name}' and '{seen[ident]}' both become asset "
                    f"{table.source}/{table.dagster_name}; set asset_name on one of them"
                )
            seen[ident] = table.name
        return self

    @model_validator(mode="after")
    def _one_writer_per_table_on_object_storage(self) -> PlatformConfig:
        """Spark's Delta on S3 keeps two commits to one table apart only within one driver (its
        single-driver log store): the windows engine's runs, two drivers at a time, could each
        commit the same version of a changelog or current, and one commit would be lost. The
        stream engine writes each table from one driver, under the source's lease."""
        if not self.lake.on_s3:
            return self
        for name, source in sorted(self.sources.items()):
            if source.apply.engine is ApplyEngine.WINDOWS:
                raise ValueError(
                    f"sources.{name}.apply.engine: windows runs a Spark driver per changelog window, and on object "
                    f"storage (lake.root {self.lake.root}) two drivers committing to one Delta table can lose a "
                    f"commit; set sources.{name}.apply.engine: stream (one driver per source writes its tables)"
                )
        return self

    def table(self, key: str) -> TableConfig:
        """Look a table up by ``source.schema.table`` (or ``source.table`` when unambiguous)."""
        for table in self.tables:
            if key in (table.key, table.name, f"{table.source}.{table.dagster_name}"):
                return table
        known = ", ".join(t.key for t in self.tables)
        raise KeyError(f"no table '{key}' in the config; configured tables: {known}")

    def streamed(self, table: TableConfig) -> bool:
        """The table's changes are applied by its source's stream apply (``cdc-platform apply``),
        not by changelog-window runs."""
        return self.sources[table.source].apply.engine is ApplyEngine.STREAM

    def tables_of(self, source: str) -> list[TableConfig]:
        return [t for t in self.tables if t.source == source]

    def topic_for(self, table: TableConfig) -> str:
        if table.topic:
            return table.topic
        prefix = self.sources[table.source].prefix(table.source)
        # Kafka topic names allow [A-Za-z0-9._-]; Debezium replaces anything else with '_'.
        return re.sub(r"[^A-Za-z0-9._-]", "_", f"{prefix}.{table.schema_name}.{table.table_name}")
