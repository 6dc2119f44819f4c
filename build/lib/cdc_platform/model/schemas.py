"""Schema versions of a source table and registry-style compatibility between them.

Pure: no Spark, no Dagster. A version is the list of columns (name, PostgreSQL type as
``format_type`` prints it, nullability, default) and the primary key. Rules, per mode:

* **BACKWARD** (default) — readers of the new schema read data written with the old one:
  a new column must be optional (nullable, or with a default); a dropped column must have
  been optional (lake readers of current rely on required columns); a type may only widen
  (old values fit the new type).
* **FORWARD** — readers of the old schema read new data: new columns may be required; a
  dropped column must have been optional; a type may only narrow.
* **FULL** — both: columns added or dropped must be optional; no type changes.
* **NONE** — anything goes (the platform still records the version).

A primary-key change is incompatible in every mode but NONE: current is merged by key.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from cdc_platform.config.model import CompatibilityMode


@dataclass(frozen=True)
class ColumnVersion:
    name: str
    type_name: str
    nullable: bool
    has_default: bool

    @property
    def optional(self) -> bool:
        return self.nullable or self.has_default


@dataclass(frozen=True)
class SchemaVersion:
    columns: tuple[ColumnVersion, ...]
    primary_key: tuple[str, ...]

    def fingerprint(self) -> str:
        payload = json.dumps([[asdict(c) for c in self.columns], list(self.primary_key)], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps({"columns": [asdict(c) for c in self.columns], "primary_key": list(self.primary_key)})

    @classmethod
    def from_json(cls, text: str) -> SchemaVersion:
        data: dict[str, Any] = json.loads(text)
        return cls(tuple(ColumnVersion(**c) for c in data["columns"]), tuple(data["primary_key"]))

    def column(self, name: str) -> ColumnVersion | None:
        return next((c for c in self.columns if c.name == name), None)


@dataclass(frozen=True)
class SchemaChange:
    """What changed between two versions, and what the mode makes of it."""

    added: tuple[str, ...]
    dropped: tuple[str, ...]
    retyped: tuple[str, ...]  # "col: old -> new"
    problems: tuple[str, ...]  # empty: compatible

    @property
    def compatible(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        parts = [f"added {', '.join(self.added)}" if self.added else ""]
        parts.append(f"dropped {', '.join(self.dropped)}" if self.dropped else "")
        parts.append(f"retyped {'; '.join(self.retyped)}" if self.retyped else "")
        return "; ".join(p for p in parts if p) or "no column changes"


_INT_RANK = {"smallint": 1, "integer": 2, "bigint": 3}
_FLOAT_RANK = {"real": 1, "double precision": 2}
_PARAM = re.compile(r"^(?P<base>[a-z ]+?)(?:\((?P<args>[0-9, ]+)\))?(?P<array>(\[\])*)$")


def _parse(type_name: str) -> tuple[str, tuple[int, ...], str]:
    match = _PARAM.match(type_name.strip())
    if not match:
        return type_name, (), ""
    args = tuple(int(a) for a in match["args"].split(",")) if match["args"] else ()
    return match["base"].strip(), args, match["array"] or ""


def widens(old: str, new: str) -> bool:
    """Every value of PostgreSQL type ``old`` is a value of ``new`` (same meaning, no loss)."""
    if old == new:
        return True
    (ob, oa, oarr), (nb, na, narr) = _parse(old), _parse(new)
    if oarr != narr:
        return False
    if ob in _INT_RANK:
        return _int_widens(ob, nb, na)
    if ob in _FLOAT_RANK and nb in _FLOAT_RANK:
        return _FLOAT_RANK[nb] >= _FLOAT_RANK[ob]
    if ob == "numeric" and nb == "numeric":
        return _numeric_widens(oa, na)
    if ob in ("character varying", "character") and nb == "text":
        return True
    if ob == "character varying" and nb == "character varying":
        return not na or (bool(oa) and na[0] >= oa[0])
    # e.g. timestamp -> timestamptz: a different meaning (wall clock vs instant), not a widening
    return False


def _int_widens(old_base: str, new_base: str, new_args: tuple[int, ...]) -> bool:
    if new_base in _INT_RANK:
        return _INT_RANK[new_base] >= _INT_RANK[old_base]
    if new_base == "numeric":
        digits = {1: 5, 2: 10, 3: 19}[_INT_RANK[old_base]]
        return not new_args or (new_args[0] - (new_args[1] if len(new_args) > 1 else 0)) >= digits
    return False


def _numeric_widens(old_args: tuple[int, ...], new_args: tuple[int, ...]) -> bool:
    if not new_args:
        return True  # unconstrained numeric holds any numeric
    if not old_args:
        return False
    o_scale, n_scale = (old_args[1] if len(old_args) > 1 else 0), (new_args[1] if len(new_args) > 1 else 0)
    return n_scale >= o_scale and new_args[0] - n_scale >= old_args[0] - o_scale


def compare(old: SchemaVersion, new: SchemaVersion, mode: CompatibilityMode) -> SchemaChange:
    old_names = {c.name for c in old.columns}
    new_names = {c.name for c in new.columns}
    added = tuple(c.name for c in new.columns if c.name not in old_names)
    dropped = tuple(c.name for c in old.columns if c.name not in new_names)
    retyped: list[str] = []
    problems: list[str] = []
    for column in new.columns:
        before = old.column(column.name)
        if before is None or before.type_name == column.type_name:
            continue
        retyped.append(f"{column.name}: {before.type_name} -> {column.type_name}")
        problems += _retype_problems(column.name, before.type_name, column.type_name, mode)
    if mode is not CompatibilityMode.NONE:
        problems += _membership_problems(old, new, added, dropped, mode)
    return SchemaChange(added, dropped, tuple(retyped), tuple(problems))


def _retype_problems(name: str, old_type: str, new_type: str, mode: CompatibilityMode) -> list[str]:
    change = f"column {name} changed type {old_type} -> {new_type}"
    if mode is CompatibilityMode.BACKWARD and not widens(old_type, new_type):
        return [f"{change}, which is not a widening (BACKWARD allows only widening: old values must fit the new type)"]
    if mode is CompatibilityMode.FORWARD and not widens(new_type, old_type):
        return [f"{change}, which is not a narrowing (FORWARD allows only narrowing: new values must fit the old type)"]
    if mode is CompatibilityMode.FULL:
        return [f"{change} (FULL)"]
    return []


def _membership_problems(
    old: SchemaVersion, new: SchemaVersion, added: tuple[str, ...], dropped: tuple[str, ...], mode: CompatibilityMode
) -> list[str]:
    """Columns added or dropped, and the key, under a mode other than NONE."""
    problems = []
    for name in added:
        new_column = new.column(name)
        assert new_column is not None
        if mode in (CompatibilityMode.BACKWARD, CompatibilityMode.FULL) and not new_column.optional:
            problems.append(
                f"column {name} was added NOT NULL without a default; {mode.value} needs new columns to "
                "be nullable or have a default"
            )
    for name in dropped:
        old_column = old.column(name)
        assert old_column is not None
        if not old_column.optional:
            problems.append(
                f"required column {name} ({old_column.type_name} NOT NULL, no default) was dropped; "
                f"{mode.value} allows dropping only nullable or defaulted columns"
            )
    if old.primary_key != new.primary_key:
        problems.append(
            f"primary key changed ({', '.join(old.primary_key)}) -> ({', '.join(new.primary_key)}); "
            "current is merged by key"
        )
    return problems
