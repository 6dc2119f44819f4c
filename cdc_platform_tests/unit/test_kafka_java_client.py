"""librdkafka's client settings as Java's, one case per setting: Spark's Kafka source (the
JVM decoder) reads a secured cluster only with settings that mean exactly what the
operator wrote; anything else is reported, and ``decoder: auto`` reads with librdkafka."""

from __future__ import annotations

import pytest

from cdc_platform.kafka.java_client import ENV_PROVIDER, java_client_settings

SCRAM_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="cdc" password="${env:PW}";'
PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="cdc" password="${env:PW}";'

# (librdkafka options, secrets by env var, Java properties, unmapped)
CASES = [
    ({}, {}, {}, ()),
    ({"security.protocol": "plaintext"}, {}, {}, ()),
    ({"security.protocol": "ssl"}, {}, {"security.protocol": "SSL"}, ()),
    (
        {"security.protocol": "SSL", "ssl.ca.location": "/etc/ca.pem"},
        {},
        {"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": "/etc/ca.pem"},
        (),
    ),
    ({"security.protocol": "ssl", "ssl.ca.location": "probe"}, {}, {"security.protocol": "SSL"}, ("ssl.ca.location",)),
    (
        {"security.protocol": "ssl", "ssl.endpoint.identification.algorithm": "none"},
        {},
        {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": ""},
        (),
    ),
    (
        {"security.protocol": "ssl", "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem"},
        {"ssl.key.password": "KEY_PW"},
        {"security.protocol": "SSL"},
        ("ssl.certificate.location", "ssl.key.location", "ssl.key.password"),
    ),
    (
        {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "cdc"},
        {"sasl.password": "PW"},
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": SCRAM_JAAS}
        | ENV_PROVIDER,
        (),
    ),
    (
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "scram-sha-256", "sasl.username": "cdc"},
        {"sasl.password": "PW"},
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": SCRAM_JAAS}
        | ENV_PROVIDER,
        (),
    ),
    (
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "cdc"},
        {"sasl.password": "PW"},
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": PLAIN_JAAS} | ENV_PROVIDER,
        (),
    ),
    (  # the user a secret too
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},
        {"sasl.username": "USER", "sasl.password": "PW"},
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": PLAIN_JAAS.replace('"cdc"', '"${env:USER}"'),
        }
        | ENV_PROVIDER,
        (),
    ),
    (  # librdkafka's default mechanism is GSSAPI (Kerberos): not translated
        {"security.protocol": "SASL_SSL", "sasl.username": "cdc"},
        {"sasl.password": "PW"},
        {"security.protocol": "SASL_SSL"},
        ("sasl.password", "sasl.username"),
    ),
    (
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"},
        {},
        {"security.protocol": "SASL_SSL"},
        ("sasl.mechanism",),
    ),
    (  # a password missing: Java's client would fail at connect
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "cdc"},
        {},
        {"security.protocol": "SASL_SSL"},
        ("sasl.mechanism", "sasl.username"),
    ),
    (  # a quote in a plain user name would end the JAAS value
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": 'c"dc'},
        {"sasl.password": "PW"},
        {"security.protocol": "SASL_SSL"},
        ("sasl.mechanism", "sasl.password", "sasl.username"),
    ),
    (  # SASL settings without a SASL protocol: librdkafka ignores them, we do not guess
        {"sasl.mechanism": "PLAIN", "sasl.username": "cdc"},
        {"sasl.password": "PW"},
        {},
        ("sasl.mechanism", "sasl.password", "sasl.username"),
    ),
    ({"security.protocol": "ssl", "client.id": "x"}, {}, {"security.protocol": "SSL"}, ("client.id",)),
    ({"security.protocol": "kerberos"}, {}, {}, ("security.protocol",)),
]


@pytest.mark.parametrize(("options", "secrets", "properties", "unmapped"), CASES)
def test_librdkafka_settings_translate_to_javas_or_are_reported(
    options: dict[str, str], secrets: dict[str, str], properties: dict[str, str], unmapped: tuple[str, ...]
) -> None:
    settings = java_client_settings(options, secrets)
    assert settings.unmapped == unmapped
    if not unmapped:
        assert settings.properties == properties


def test_a_secret_reaches_the_java_client_as_an_environment_reference_only() -> None:
    settings = java_client_settings(
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "cdc"},
        {"sasl.password": "KAFKA_PW"},
    )
    assert settings.jaas_env == ("KAFKA_PW",)
    assert 'password="${env:KAFKA_PW}"' in settings.properties["sasl.jaas.config"]
    assert settings.properties["config.providers.env.class"].endswith(".EnvVarConfigProvider")
