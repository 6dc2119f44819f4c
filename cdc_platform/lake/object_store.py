"""A lake on an S3-compatible store: one ``lake.s3`` section configures both clients.

Spark reaches ``s3a://`` through Hadoop's S3A (``hadoop-aws`` and the AWS SDK's S3 modules,
resolved into the Spark jars by scripts/bootstrap.sh); delta-rs (the ledger, the driver's
appends and merges, VACUUM) through its own S3 client. Each has its own names for the same
settings, so both sets are derived here from one config, by pure functions.

Secrets: the access key pair is read from the environment variables the config names. Spark
gets it in its Hadoop configuration once the session runs, apart from the conf a Dagster resource shows
(never in ``spark.conf``, so never in the UI); executors receive it with the tasks' Hadoop
configuration. delta-rs gets it through the ``AWS_*`` variables of the process, which its
client reads whenever a table is opened without explicit options.

Commits: delta-rs commits with S3's conditional put (``If-None-Match``), so concurrent
delta-rs writers never overwrite each other's commit. Spark's Delta uses its single-driver
S3 log store, which is safe for one writing driver per table at a time; see the README
("A lake on object storage") for what that means for the platform's processes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cdc_platform.config.model import LakeConfig, S3Config, read_secret

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

S3A_PREFIX = "spark.hadoop.fs.s3a."


def spark_s3a_conf(s3: S3Config) -> dict[str, str]:
    """Spark conf (``spark.hadoop.fs.s3a.*``) for the store, without secrets."""
    conf = {
        "endpoint.region": s3.region,
        "path.style.access": str(s3.path_style).lower(),
    }
    if s3.endpoint is not None:
        conf["endpoint"] = s3.endpoint.rstrip("/")
        conf["connection.ssl.enabled"] = str(s3.endpoint.startswith("https://")).lower()
    return {S3A_PREFIX + key: value for key, value in conf.items()}


def s3a_credentials(s3: S3Config) -> dict[str, str]:
    """The Hadoop settings holding the key pair (secrets: never log or show these)."""
    if s3.access_key_id_env is None or s3.secret_access_key_env is None:
        return {}
    return {
        "fs.s3a.access.key": read_secret(s3.access_key_id_env, "lake.s3.access_key_id_env").get_secret_value(),
        "fs.s3a.secret.key": read_secret(s3.secret_access_key_env, "lake.s3.secret_access_key_env").get_secret_value(),
    }


def delta_rs_environment(s3: S3Config) -> dict[str, str]:
    """The ``AWS_*`` variables delta-rs' S3 client reads (secrets included)."""
    env = {"AWS_REGION": s3.region, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not s3.path_style).lower()}
    if s3.endpoint is not None:
        env["AWS_ENDPOINT_URL"] = s3.endpoint.rstrip("/")
        env["AWS_ALLOW_HTTP"] = str(s3.endpoint.startswith("http://")).lower()
    credentials = s3a_credentials(s3)
    if credentials:
        env["AWS_ACCESS_KEY_ID"] = credentials["fs.s3a.access.key"]
        env["AWS_SECRET_ACCESS_KEY"] = credentials["fs.s3a.secret.key"]
    return env


def pyarrow_uri(path: str) -> str:
    """``path`` as pyarrow's filesystems name it: they know ``s3://`` (and read the same
    ``AWS_*`` variables as delta-rs), not Hadoop's ``s3a://``."""
    return "s3://" + path[len("s3a://") :] if path.lower().startswith("s3a://") else path


def prepare_lake_environment(lake: LakeConfig) -> None:
    """Point this process's delta-rs at the lake's store (a local lake: nothing to do).

    The config's settings win over ``AWS_*`` variables already set: they name this lake."""
    if lake.s3 is not None:
        os.environ.update(delta_rs_environment(lake.s3))


def give_session_object_store(session: SparkSession, lake: LakeConfig | None) -> None:
    """The store's settings and key pair into the session's Hadoop configuration, before
    anything opens the lake (S3A caches a store's client, and its credentials, at the first
    use). A setting the session already has (``spark.conf``) is kept; a session started
    without the lake's conf (another lake's, a test's) gets the store's."""
    if lake is None or lake.s3 is None:
        return
    hadoop = session.sparkContext._jsc.hadoopConfiguration()
    for key, value in spark_s3a_conf(lake.s3).items():
        name = key.removeprefix("spark.hadoop.")
        if hadoop.get(name) is None:
            hadoop.set(name, value)
    for key, value in s3a_credentials(lake.s3).items():
        hadoop.set(key, value)
