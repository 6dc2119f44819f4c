"""A lake on an S3-compatible store: one ``lake.s3`` section gives Spark's S3A and delta-rs
the same store, and its key pair reaches neither Spark's conf nor Dagster's resource config
(what the UI shows). The store itself is exercised in ``spark/test_object_store.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdc_platform.config import ConfigError, MissingSecretError, load_config
from cdc_platform.config.model import LakeConfig, SparkConfig
from cdc_platform.lake.object_store import delta_rs_environment, pyarrow_uri, spark_s3a_conf
from cdc_platform.lake.session import long_running_conf, session_conf
from cdc_platform_tests.unit.test_config import VALID, problems, write

KEY_ID, SECRET = "AKIA-test-key-id", "s3cr3t-value-never-shown"
S3_LAKE = """\
lake:
  root: s3a://lake-bucket/prod
  s3:
    endpoint: http://127.0.0.1:9444
    path_style: true
    access_key_id_env: TEST_S3_KEY_ID
    secret_access_key_env: TEST_S3_SECRET
"""


@pytest.fixture
def s3_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_S3_KEY_ID", KEY_ID)
    monkeypatch.setenv("TEST_S3_SECRET", SECRET)
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)  # monkeypatch restores what load_config sets


def s3_config_text() -> str:
    streamed = VALID.replace(
        "    password_env: TEST_PG_PASSWORD\n", "    password_env: TEST_PG_PASSWORD\n    apply: {engine: stream}\n"
    )
    return streamed.replace("lake:\n  root: lake\n", S3_LAKE)


def test_an_s3_lake_configures_spark_and_delta_rs_alike(tmp_path: Path, s3_keys: None) -> None:
    config = load_config(write(tmp_path, s3_config_text()))
    assert config.lake.root == "s3a://lake-bucket/prod"  # a URI is not made relative to the file
    conf = session_conf(SparkConfig(), config.lake)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9444"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    # delta-rs in this process (the ledger) reads the same store from the environment
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9444"
    assert os.environ["AWS_ALLOW_HTTP"] == "true"
    assert os.environ["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == (KEY_ID, SECRET)


def test_the_key_pair_never_reaches_spark_conf_or_dagster(tmp_path: Path, s3_keys: None) -> None:
    from cdc_platform.orchestration.resources import CdcSparkResource

    path = write(tmp_path, s3_config_text())
    lake = load_config(path).lake
    for conf in (session_conf(SparkConfig(), lake), long_running_conf(SparkConfig(), lake)):
        assert not [k for k, v in conf.items() if SECRET in v or KEY_ID in v], conf
    for long_running in (False, True):
        shown = repr(CdcSparkResource.for_config(str(path), long_running=long_running))  # the UI's resource config
        assert "127.0.0.1:9444" in shown and SECRET not in shown and KEY_ID not in shown


def test_the_users_spark_conf_wins_over_the_derived_one(s3_keys: None) -> None:
    lake = LakeConfig.model_validate({"root": "s3a://b/p", "s3": {"endpoint": "https://store.example:443"}})
    spark = SparkConfig(conf={"spark.hadoop.fs.s3a.endpoint": "https://other.example"})
    conf = session_conf(spark, lake)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://other.example"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"


def test_aws_itself_needs_no_endpoint_and_takes_the_default_credentials() -> None:
    lake = LakeConfig.model_validate({"root": "s3a://b/p", "s3": {"region": "eu-west-1"}})
    assert lake.s3 is not None
    assert spark_s3a_conf(lake.s3) == {
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.path.style.access": "false",
    }
    # no key pair: each process and executor uses the AWS chain (profile, instance or pod role)
    assert delta_rs_environment(lake.s3) == {"AWS_REGION": "eu-west-1", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}


def test_a_missing_secret_names_its_variable_not_a_value(
    tmp_path: Path, s3_keys: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_S3_SECRET")
    with pytest.raises(MissingSecretError, match="TEST_S3_SECRET") as info:
        load_config(write(tmp_path, s3_config_text()))
    assert KEY_ID not in str(info.value)


@pytest.mark.parametrize(
    ("lake", "expected"),
    [
        ("lake:\n  root: s3://bucket/lake\n", "write s3a://"),
        ("lake:\n  root: gs://bucket/lake\n", "'gs://' is not supported"),
        ("lake:\n  root: lake\n  s3: {region: eu-west-1}\n", "lake.s3 is set but root"),
        ("lake:\n  root: s3a://b/l\n  s3: {access_key_id_env: ONLY_ONE}\n", "set both access_key_id_env"),
        ("lake:\n  root: s3a://b/l\n", "apply.engine: windows"),  # AWS' defaults, but the windows engine (below)
        ("lake:\n  root: s3a://b/l\n  s3: {endpoint: 'ftp://x'}\n", "lake.s3.endpoint"),
    ],
)
def test_a_lake_the_platform_cannot_reach_is_refused_at_load(tmp_path: Path, lake: str, expected: str) -> None:
    secret = "    password_env: TEST_PG_PASSWORD\n"
    windows = VALID.replace(secret, secret + "    apply: {engine: windows}\n")
    found = problems(tmp_path, windows.replace("lake:\n  root: lake\n", lake))
    assert len(found) == 1 and expected in found[0], found


def test_the_windows_engine_is_refused_on_object_storage(tmp_path: Path, s3_keys: None) -> None:
    """Its runs are Spark drivers of their own, two at a time, and Spark's Delta on S3 keeps
    commits to one table apart only within one driver: a commit could be lost."""
    text = s3_config_text().replace("    apply: {engine: stream}\n", "    apply: {engine: windows}\n")
    found = problems(tmp_path, text)
    assert len(found) == 1 and "sources.shop.apply.engine: windows" in found[0] and "engine: stream" in found[0]


def test_a_config_error_is_raised_for_an_unknown_s3_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'secret_access_key'"):
        load_config(
            write(
                tmp_path,
                VALID.replace("lake:\n  root: lake\n", "lake:\n  root: s3a://b/l\n  s3: {secret_access_key: x}\n"),
            )
        )


def test_pyarrow_reads_hadoops_s3a_uris_as_s3() -> None:
    assert pyarrow_uri("s3a://bucket/lake/t/part-0.parquet") == "s3://bucket/lake/t/part-0.parquet"
    assert pyarrow_uri("S3A://bucket/x") == "s3://bucket/x"
    assert pyarrow_uri("/data/lake/t/part-0.parquet") == "/data/lake/t/part-0.parquet"
