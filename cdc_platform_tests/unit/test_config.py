"""Config validation: each class of bad input gets a message naming file, line, field and fix."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from cdc_platform.config import ConfigError, MissingSecretError, load_config
from cdc_platform.config.model import CompatibilityMode, ErrorTolerance

REPO_ROOT = Path(__file__).resolve().parents[2]

VALID = """\
sources:
  shop:
    host: 127.0.0.1
    port: 5433
    database: shop
    user: cdc_capture
    password_env: TEST_PG_PASSWORD
kafka:
  bootstrap_servers: 127.0.0.1:9092
lake:
  root: lake
tables:
  - name: shop.public.customers
  - name: shop.public.audit_events
    primary_key: [event_id]
    changelog: {window: 15m}
    compatibility: FULL
    errors: {tolerance: all}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cdc_platform.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return info.value.problems


def test_valid_file_loads_with_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID))
    customers, audit = config.tables
    assert customers.key == "shop.public.customers"
    assert customers.primary_key is None  # taken from the source's primary key
    assert customers.compatibility is CompatibilityMode.BACKWARD
    assert customers.errors.tolerance is ErrorTolerance.NONE
    assert customers.changelog.window == "1h"
    assert customers.changelog.cron_schedule() == "0 * * * *"
    assert audit.changelog.cron_schedule() == "*/15 * * * *"
    assert audit.primary_key == ["event_id"]
    assert config.topic_for(customers) == "shop.public.customers"
    assert config.spark.master == "local[*]"
    # a relative lake root is relative to the config file, not the working directory
    assert config.lake.root == str((tmp_path / "lake").resolve())


def test_the_repos_demo_config_is_valid() -> None:
    config = load_config(REPO_ROOT / "cdc_platform.yaml")
    assert {t.source for t in config.tables} == {"shop", "bench", "crm"}
    assert config.table("shop.public.audit_events").primary_key == ["event_id"]
    accounts = config.table("crm.crm.accounts")
    assert config.table("shop.public.orders").poll is None
    assert accounts.poll is not None and accounts.poll.mode == "timestamp+incrementing"


def test_missing_field_names_file_line_and_field(tmp_path: Path) -> None:
    text = VALID.replace("    database: shop\n", "")
    assert problems(tmp_path, text) == ["cdc_platform.yaml:3: sources.shop.database: required field is missing"]


def test_wrong_type(tmp_path: Path) -> None:
    text = VALID.replace("port: 5433", "port: fivefourthreethree")
    [problem] = problems(tmp_path, text)
    assert problem.startswith("cdc_platform.yaml:4: sources.shop.port: ")
    assert "valid integer" in problem


def test_unknown_key_lists_the_allowed_keys(tmp_path: Path) -> None:
    text = VALID.replace("  bootstrap_servers:", "  partitons: 6\n  bootstrap_servers:")
    [problem] = problems(tmp_path, text)
    assert problem.startswith("cdc_platform.yaml:9: kafka.partitons: unknown key 'partitons'; allowed keys: ")
    assert "partitions" in problem and "bootstrap_servers" in problem


def test_unknown_key_inside_a_table(tmp_path: Path) -> None:
    text = VALID.replace("    compatibility: FULL", "    compatability: FULL")
    [problem] = problems(tmp_path, text)
    assert problem.startswith("cdc_platform.yaml:17: tables[1].compatability: unknown key 'compatability'")
    assert "compatibility" in problem


def test_bad_table_name_explains_the_format(tmp_path: Path) -> None:
    text = VALID.replace("shop.public.customers", "customers")
    [problem] = problems(tmp_path, text)
    assert problem.startswith("cdc_platform.yaml:13: tables[0].name: 'customers' is not '<source>.<schema>.<table>'")


def test_quoted_identifiers_are_table_names(tmp_path: Path) -> None:
    text = VALID.replace("shop.public.customers", "'shop.public.\"Order Items\"'")
    config = load_config(write(tmp_path, text))
    table = config.tables[0]
    assert (table.schema_name, table.table_name) == ("public", "Order Items")
    assert table.dagster_name == "order_items"
    assert config.topic_for(table) == "shop.public.Order_Items"


def test_enum_lists_allowed_values(tmp_path: Path) -> None:
    text = VALID.replace("compatibility: FULL", "compatibility: STRICT")
    [problem] = problems(tmp_path, text)
    assert "tables[1].compatibility" in problem
    for mode in ("BACKWARD", "FORWARD", "FULL", "NONE"):
        assert mode in problem


def test_errors_tolerance_values(tmp_path: Path) -> None:
    [problem] = problems(tmp_path, VALID.replace("tolerance: all", "tolerance: some"))
    assert "tables[1].errors.tolerance" in problem and "'none'" in problem and "'all'" in problem


def test_completeness_in_flight_cap_defaults_and_must_not_be_negative(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, VALID.replace("errors: {tolerance: all}", "completeness: {max_in_flight_offsets: 5000}"))
    )
    assert [t.completeness.max_in_flight_offsets for t in config.tables] == [200_000, 5000]
    [problem] = problems(
        tmp_path, VALID.replace("errors: {tolerance: all}", "completeness: {max_in_flight_offsets: -1}")
    )
    assert "tables[1].completeness.max_in_flight_offsets" in problem


def test_window_must_divide_the_hour(tmp_path: Path) -> None:
    [problem] = problems(tmp_path, VALID.replace("window: 15m", "window: 7m"))
    assert "tables[1].changelog.window: '7m' does not divide an hour or a day evenly" in problem


def test_the_check_period_defaults_to_ten_minutes_and_must_divide_the_hour_or_day(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID.replace("errors: {tolerance: all}", "checks: {every: 6h}")))
    assert [t.checks.every for t in config.tables] == ["10m", "6h"]
    [problem] = problems(tmp_path, VALID.replace("errors: {tolerance: all}", "checks: {every: 7h}"))
    assert "tables[1].checks.every: '7h' does not divide an hour or a day evenly; use one of 1m" in problem


def test_table_of_an_undeclared_source(tmp_path: Path) -> None:
    [problem] = problems(tmp_path, VALID.replace("shop.public.customers", "crm.public.customers"))
    assert "source 'crm' is not declared under sources (declared: shop)" in problem


def test_two_tables_with_one_asset_name(tmp_path: Path) -> None:
    text = VALID.replace(
        "  - name: shop.public.customers\n", "  - name: shop.public.customers\n  - name: shop.crm.customers\n"
    )
    [problem] = problems(tmp_path, text)
    assert "both become asset shop/customers; set asset_name" in problem


def test_several_errors_are_reported_together(tmp_path: Path) -> None:
    text = VALID.replace("port: 5433", "port: x").replace("compatibility: FULL", "compatibility: X")
    assert len(problems(tmp_path, text)) == 2


def test_plain_text_password_is_refused_without_echoing_it(tmp_path: Path) -> None:
    text = VALID.replace("password_env: TEST_PG_PASSWORD", "password: hunter2-plain")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    message = str(info.value)
    assert "sources.shop: a plain-text password is not allowed here" in message
    assert "password_env" in message
    assert "hunter2-plain" not in message
    assert "hunter2-plain" not in repr(info.value)


def test_plain_text_kafka_secret_is_refused(tmp_path: Path) -> None:
    text = VALID.replace(
        "  bootstrap_servers: 127.0.0.1:9092\n",
        "  bootstrap_servers: 127.0.0.1:9092\n  options:\n    sasl.password: kafka-pw-plain\n",
    )
    [problem] = problems(tmp_path, text)
    assert "kafka.options: 'sasl.password' is a secret and may not be written in plain text" in problem
    assert "kafka.secret_options_env" in problem
    assert "kafka-pw-plain" not in problem


def test_secrets_resolve_from_env_and_never_show_in_reprs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = VALID.replace(
        "  bootstrap_servers: 127.0.0.1:9092\n",
        "  bootstrap_servers: 127.0.0.1:9092\n"
        "  options: {security.protocol: SASL_SSL, sasl.mechanism: SCRAM-SHA-512, sasl.username: u}\n"
        "  secret_options_env: {sasl.password: TEST_KAFKA_PASSWORD}\n",
    )
    config = load_config(write(tmp_path, text))
    monkeypatch.setenv("TEST_PG_PASSWORD", "pg-secret-value")
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "kafka-secret-value")
    password = config.sources["shop"].password("shop")
    assert password.get_secret_value() == "pg-secret-value"
    client = config.kafka.client_config()
    # security options reach the client as given, the secret from the environment
    assert client["security.protocol"] == "SASL_SSL"
    assert client["sasl.password"] == "kafka-secret-value"
    for shown in (repr(config), str(config), config.model_dump_json(), repr(password), str(password)):
        assert "pg-secret-value" not in shown
        assert "kafka-secret-value" not in shown
    # the changelog's Spark source: TLS/SASL options travel in its options, the secret by
    # name only; each worker builds its consumer config with the secret from its environment
    from cdc_platform.kafka.clients import worker_options

    options = worker_options(config.kafka)
    assert "kafka-secret-value" not in json.dumps(options)
    worker = json.loads(options["client_config"])
    assert (worker["security.protocol"], worker["sasl.mechanism"], worker["sasl.username"]) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "u",
    )
    assert json.loads(options["secret_options_env"]) == {"sasl.password": "TEST_KAFKA_PASSWORD"}


def test_missing_secret_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(write(tmp_path, VALID))
    monkeypatch.delenv("TEST_PG_PASSWORD", raising=False)
    with pytest.raises(MissingSecretError, match=r"TEST_PG_PASSWORD is not set \(named by sources.shop.password_env\)"):
        config.sources["shop"].password("shop")


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    [problem] = problems(tmp_path, "sources: [\n")
    assert problem.startswith("not valid YAML")


def test_config_path_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, VALID)
    monkeypatch.setenv("CDC_PLATFORM_CONFIG", str(path))
    assert load_config().tables[0].key == "shop.public.customers"


DEBEZIUM_SOURCE = """\
    producer:
      kind: debezium
      connector: shop-connector
      settings:
        snapshot.mode: no_data
        skipped.operations: none
        interval.handling.mode: string
        plugin.name: pgoutput
"""


def with_debezium(settings: str = "") -> str:
    text = VALID.replace(
        "    password_env: TEST_PG_PASSWORD\n", "    password_env: TEST_PG_PASSWORD\n" + DEBEZIUM_SOURCE + settings
    )
    return text.replace("  bootstrap_servers:", "  cleanup_policy: delete\n  bootstrap_servers:")


def test_a_debezium_producer_is_read_with_its_representation(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, with_debezium("        time.precision.mode: adaptive_time_microseconds\n")))
    source = config.sources["shop"]
    assert source.value_encoding().time_precision == "adaptive_time_microseconds"
    # Debezium's defaults name the slot and publication the lake's advice must name
    assert (source.slot("shop"), source.publication_name("shop")) == ("debezium", "dbz_publication")


@pytest.mark.parametrize(
    ("setting", "named_fix"),
    [
        ("        interval.handling.mode: numeric\n", "interval.handling.mode=string"),
        ("        decimal.handling.mode: double\n", "decimal.handling.mode=precise"),
        ("        time.precision.mode: connect\n", "time.precision.mode=adaptive_time_microseconds"),
        ("        hstore.handling.mode: map\n", "hstore.handling.mode=json"),
        ("        snapshot.mode: initial\n", "snapshot.mode=no_data"),
        ("        skipped.operations: t\n", "skipped.operations=none"),
        ("        column.truncate.to.20.chars: public.t.c\n", "not a setting the lake reads"),
    ],
)
def test_a_debezium_setting_that_changes_values_is_refused_with_the_fix(
    tmp_path: Path, setting: str, named_fix: str
) -> None:
    text = with_debezium()
    key = setting.strip().split(":")[0]
    text = "\n".join(line for line in text.splitlines() if not line.strip().startswith(key + ":")) + "\n"
    text = text.replace("        plugin.name: pgoutput\n", "        plugin.name: pgoutput\n" + setting)
    [problem] = problems(tmp_path, text)
    assert named_fix in problem


def test_a_connect_url_with_credentials_is_refused_and_never_shown(tmp_path: Path) -> None:
    """Kafka Connect's URL is only shown in advice (logs, check descriptions, the UI): a
    URL with a user and password in it would put them there."""
    url = "      connect_url: https://cdc:s3cret-pass@connect.internal:8083\n"
    text = with_debezium().replace("      connector: shop-connector\n", "      connector: shop-connector\n" + url)
    [problem] = problems(tmp_path, text)
    assert "holds credentials" in problem and "without them" in problem and "s3cret-pass" not in problem
    plain = text.replace("cdc:s3cret-pass@", "")
    assert load_config(write(tmp_path, plain)).sources["shop"].producer.connect_url == "https://connect.internal:8083"  # type: ignore[union-attr]


def test_debezium_defaults_the_lake_cannot_take_must_be_set(tmp_path: Path) -> None:
    text = with_debezium().replace("        interval.handling.mode: string\n", "")
    [problem] = problems(tmp_path, text)
    assert "interval.handling.mode=numeric (Debezium's default) is refused" in problem


def test_interval_handling_numeric_is_refused_not_ignored(tmp_path: Path) -> None:
    text = VALID.replace(
        "    password_env: TEST_PG_PASSWORD\n", "    password_env: TEST_PG_PASSWORD\n    interval_handling: numeric\n"
    )
    [problem] = problems(tmp_path, text)
    assert "interval_handling: numeric is not read by the lake" in problem


def test_debezium_needs_topics_that_accept_keyless_truncates(tmp_path: Path) -> None:
    text = with_debezium().replace("  cleanup_policy: delete\n", "")
    [problem] = problems(tmp_path, text)
    assert "kafka.cleanup_policy: delete" in problem


def test_capture_settings_are_refused_for_a_debezium_source(tmp_path: Path) -> None:
    text = with_debezium().replace("    producer:\n", "    decimal_handling: string\n    producer:\n")
    [problem] = problems(tmp_path, text)
    assert "producer.settings" in problem


def test_a_key_written_twice_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    text = (
        "sources:\n  shop:\n    database: shop\n    user: u\n    password_env: PW\n"
        "    apply: {engine: stream}\n    apply: {engine: windows}\n"
        "kafka: {bootstrap_servers: 'k:9092'}\nlake: {root: lake}\ntables: [{name: shop.public.t}]\n"
    )
    assert problems(tmp_path, text) == [
        "cdc_platform.yaml:7: sources.shop.apply: written twice (first on line 6); keep one"
    ]
