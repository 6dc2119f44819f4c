"""The structure the code promises (README, "Where things live"), checked on the source:
Dagster only at the edge, source kinds chosen in one place, one Kafka client factory,
one owner of replication-slot queries, short functions outside the protocol decoders."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "cdc_platform"
MAX_FUNCTION_LINES = 60
# protocol and type decoders: one flat branch per message or type kind
DECODERS = {"envelope/pgoutput.py", "envelope/pgtypes.py", "envelope/decode.py", "envelope/changes.py",
            "envelope/debezium.py", "sources/mysql/catalog.py"}  # fmt: skip
CORE = ("config", "model", "envelope", "sources", "kafka", "lake")


def modules(under: str = "") -> dict[str, str]:
    root = PACKAGE / under
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(root.rglob("*.py"))}


def imported(text: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_core_imports_no_dagster() -> None:
    offenders = [
        path
        for package in CORE
        for path, text in modules(package).items()
        if any(name == "dagster" or name.startswith(("dagster.", "dagster_")) for name in imported(text))
    ]
    assert offenders == []


def test_source_kinds_are_resolved_in_config_and_chosen_once() -> None:
    """Only config/ and the connector registry (sources/__init__.py) name the kinds' config classes."""
    pattern = re.compile(r"\b(PostgresSource|JdbcSource)\b")
    allowed = ("config/", "sources/__init__.py", "sources/postgres/", "sources/mysql/")
    offenders = [path for path, text in modules().items() if pattern.search(text) and not path.startswith(allowed)]
    assert offenders == []


def test_kafka_clients_are_built_in_one_place() -> None:
    pattern = re.compile(r"\b(Consumer|Producer|AdminClient)\(")
    allowed = {"kafka/clients.py", "devtools/stack/kafka.py", "devtools/stack/kafka_cluster.py"}  # stack health checks
    offenders = [path for path, text in modules().items() if pattern.search(text) and path not in allowed]
    assert offenders == []


def test_replication_slots_are_queried_in_one_place() -> None:
    offenders = [path for path, text in modules().items() if "pg_replication_slots" in text]
    assert offenders == ["sources/postgres/slot.py"]


@pytest.mark.parametrize("path", sorted(set(modules()) - DECODERS))
def test_no_function_is_longer_than_sixty_lines(path: str) -> None:
    tree = ast.parse((PACKAGE / path).read_text())
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []
