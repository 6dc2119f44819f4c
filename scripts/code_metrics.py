"""Structure figures of the product code (cdc_platform/), for review notes.

    .venv/bin/python scripts/code_metrics.py [PACKAGE_DIR]

Prints: the longest functions, files over 400 lines, functions that take the whole
``PlatformConfig``, Kafka client construction sites, replication-slot query sites.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

LONG_FILE = 400
KAFKA_CLIENT = re.compile(r"\b(Consumer|Producer|AdminClient)\(")
SLOT_QUERY = re.compile(r"pg_replication_slots")


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def takes_whole_config(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    return any(a.annotation is not None and "PlatformConfig" in ast.unparse(a.annotation) for a in args)


def main(root: Path) -> None:
    lengths: list[tuple[int, str]] = []
    long_files: list[tuple[int, str]] = []
    whole_config = kafka_sites = slot_sites = 0
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = str(path.relative_to(root.parent))
        lines = text.count("\n") + 1
        if lines > LONG_FILE:
            long_files.append((lines, rel))
        kafka_sites += len(KAFKA_CLIENT.findall(text))
        slot_sites += len(SLOT_QUERY.findall(text))
        for fn in functions(ast.parse(text)):
            assert fn.end_lineno is not None
            lengths.append((fn.end_lineno - fn.lineno + 1, f"{rel}:{fn.lineno} {fn.name}"))
            whole_config += takes_whole_config(fn)
    lengths.sort(reverse=True)
    print(f"functions: {len(lengths)}; longest: {lengths[0][0]} lines ({lengths[0][1]})")
    print("  over 60 lines: " + str(sum(1 for n, _ in lengths if n > 60)))
    for n, where in lengths[:8]:
        print(f"  {n:4d}  {where}")
    print(f"files over {LONG_FILE} lines: {len(long_files)}")
    for n, where in sorted(long_files, reverse=True):
        print(f"  {n:4d}  {where}")
    print(f"functions taking the whole PlatformConfig: {whole_config}")
    print(f"Kafka client construction sites (Consumer/Producer/AdminClient): {kafka_sites}")
    print(f"replication-slot query sites (pg_replication_slots): {slot_sites}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "cdc_platform").resolve())
