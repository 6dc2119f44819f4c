"""librdkafka client settings as Java Kafka client settings, for Spark's Kafka source.

The platform's Kafka settings (``kafka.options``, ``kafka.secret_options_env``) are
librdkafka's. Spark's Kafka source is Java's client, whose names and shapes differ: SASL
credentials are one JAAS line, a CA file is a PEM truststore. The settings a secured
production cluster needs (TLS with a CA file, SASL PLAIN or SCRAM with a user and
password) translate exactly; anything else is reported as unmapped, and ``decoder: auto``
then reads with librdkafka in Spark's Python workers instead of guessing.

Secrets stay out of Spark's options and plan: a secret is written as ``${env:VAR}``,
which Java's client resolves itself (Kafka's ``EnvVarConfigProvider``) from the
environment of the JVM that reads, as the Python reader reads it in its worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ENV_PROVIDER = {
    "config.providers": "env",
    "config.providers.env.class": "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
}
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# a JAAS value is a double-quoted string; Kafka's parser reads \ as an escape
JAAS_UNSAFE = ('"', "\\")
_SASL_KEYS = ("sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password")


@dataclass(frozen=True)
class JavaClientSettings:
    """Java client properties (without Spark's ``kafka.`` prefix), what had no exact
    counterpart, and the environment variables a JAAS line takes its values from."""

    properties: dict[str, str] = field(default_factory=dict)
    unmapped: tuple[str, ...] = ()
    jaas_env: tuple[str, ...] = ()


def java_client_settings(options: Mapping[str, str], secret_options_env: Mapping[str, str]) -> JavaClientSettings:
    """The Java client's equivalent of librdkafka's ``options`` and secrets by env var."""
    properties: dict[str, str] = {}
    unmapped: list[str] = []
    protocol = options.get("security.protocol", "plaintext").upper()
    if protocol not in PROTOCOLS:
        unmapped.append("security.protocol")
    elif protocol != "PLAINTEXT":
        properties["security.protocol"] = protocol
    mapped_tls = _tls(options, properties, unmapped)
    sasl = _sasl(protocol, options, secret_options_env, properties, unmapped)
    handled = {"security.protocol", *mapped_tls, *_SASL_KEYS}
    unmapped += [key for key in options if key not in handled]
    unmapped += [key for key in secret_options_env if key not in ("sasl.username", "sasl.password")]
    return JavaClientSettings(properties, tuple(sorted(set(unmapped))), sasl)


def _tls(options: Mapping[str, str], properties: dict[str, str], unmapped: list[str]) -> tuple[str, ...]:
    """A CA file becomes a PEM truststore; hostname checking carries over. Client
    certificates (mTLS) do not: Java wants key and chain in one PEM file."""
    ca = options.get("ssl.ca.location")
    if ca is not None:
        if ca == "probe":  # librdkafka searches the system's CA paths; Java uses its own store
            unmapped.append("ssl.ca.location")
        else:
            properties |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": ca}
    check = options.get("ssl.endpoint.identification.algorithm")
    if check is not None:
        if check.lower() in ("https", "none"):
            properties["ssl.endpoint.identification.algorithm"] = "https" if check.lower() == "https" else ""
        else:
            unmapped.append("ssl.endpoint.identification.algorithm")
    return "ssl.ca.location", "ssl.endpoint.identification.algorithm"


def _sasl(
    protocol: str,
    options: Mapping[str, str],
    secrets: Mapping[str, str],
    properties: dict[str, str],
    unmapped: list[str],
) -> tuple[str, ...]:
    """A user and password for PLAIN or SCRAM become one JAAS line; the environment
    variables it reads are returned (their values must be JAAS-safe, see ``jaas_safe``)."""
    given = [key for key in _SASL_KEYS if key in options or key in secrets]
    if not protocol.startswith("SASL_"):
        unmapped += given  # librdkafka ignores them; say so rather than carry them
        return ()
    mechanism = (options.get("sasl.mechanism") or options.get("sasl.mechanisms") or "GSSAPI").upper()
    values = {key: _jaas_value(key, options, secrets) for key in ("sasl.username", "sasl.password")}
    if mechanism not in LOGIN_MODULES or None in values.values():
        unmapped += given or ["security.protocol"]  # GSSAPI, OAUTHBEARER, or a credential missing
        return ()
    properties["sasl.mechanism"] = mechanism
    properties["sasl.jaas.config"] = (
        f'{LOGIN_MODULES[mechanism]} required username="{values["sasl.username"]}" '
        f'password="{values["sasl.password"]}";'
    )
    if any(key in secrets for key in values):
        properties |= ENV_PROVIDER
    return tuple(secrets[key] for key in values if key in secrets)


def _jaas_value(key: str, options: Mapping[str, str], secrets: Mapping[str, str]) -> str | None:
    """A JAAS value: a secret as ``${env:VAR}``; a plain value only when it needs no escape."""
    if key in secrets:
        return "${env:" + secrets[key] + "}"
    value = options.get(key)
    return value if value is not None and not any(c in value for c in JAAS_UNSAFE) else None


def jaas_safe(value: str) -> bool:
    """Whether a secret can be carried into a JAAS line by ``${env:…}`` as it is."""
    return not any(c in value for c in JAAS_UNSAFE)
