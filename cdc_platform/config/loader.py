"""Load and validate the YAML config, with errors that name file, line, field and fix."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from cdc_platform.config.model import JdbcSource, PlatformConfig, PostgresSource
from cdc_platform.lake.object_store import prepare_lake_environment

SOURCE_MODELS: dict[str, type[BaseModel]] = {"postgres": PostgresSource, "jdbc": JdbcSource}

CONFIG_ENV = "CDC_PLATFORM_CONFIG"
DEFAULT_CONFIG_NAME = "cdc_platform.yaml"


class ConfigError(ValueError):
    """The config file is missing or invalid. ``problems`` holds one line per error."""

    def __init__(self, path: Path, problems: Sequence[str]) -> None:
        self.path = path
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid config {path}:\n{lines}")


def default_config_path() -> Path:
    """``$CDC_PLATFORM_CONFIG``, else ``cdc_platform.yaml`` in the working directory."""
    return Path(os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_NAME)


def load_config(path: str | os.PathLike[str] | None = None) -> PlatformConfig:
    config_path = Path(path) if path is not None else default_config_path()
    if not config_path.is_file():
        raise ConfigError(
            config_path,
            [f"file not found; create it (see README, 'Config') or set {CONFIG_ENV} to its path"],
        )
    text = config_path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(config_path, [f"not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(config_path, ["the top level must be a mapping with sources, kafka, lake, tables"])
    repeated = list(_repeated_keys(node, (), config_path.name))
    if repeated:  # YAML keeps the last one silently: a setting the user wrote would be ignored
        raise ConfigError(config_path, repeated)
    try:
        config = PlatformConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(config_path, _describe(exc, node, config_path)) from None
    config = _resolve_paths(config, config_path)
    # every process that reads the config reads the lake: delta-rs (the ledger, the driver's
    # merges) opens it with the process's AWS_* variables, set here from lake.s3
    prepare_lake_environment(config.lake)
    return config


def _repeated_keys(node: yaml.Node | None, at: tuple[str, ...], name: str) -> list[str]:
    """``file:line: path.key: written twice`` for every key repeated within one mapping."""
    found: list[str] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            label = str(key.value)
            line = key.start_mark.line + 1
            if label in first:
                where = ".".join((*at, label))
                found.append(f"{name}:{line}: {where}: written twice (first on line {first[label]}); keep one")
            first.setdefault(label, line)
            found.extend(_repeated_keys(value, (*at, label), name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found.extend(_repeated_keys(item, (*at[:-1], f"{at[-1]}[{i}]") if at else (f"[{i}]",), name))
    return found


def _resolve_paths(config: PlatformConfig, config_path: Path) -> PlatformConfig:
    """Relative paths (the lake root, the jars directory) are relative to the config file,
    not to the working directory."""
    base = config_path.resolve().parent
    root = config.lake.root
    if "://" not in root and not Path(root).is_absolute():
        config = config.model_copy(
            update={"lake": config.lake.model_copy(update={"root": str((base / root).resolve())})}
        )
    jars = config.spark.jars_dir
    if jars is not None and not Path(jars).is_absolute():
        spark = config.spark.model_copy(update={"jars_dir": str((base / jars).resolve())})
        config = config.model_copy(update={"spark": spark})
    return config


def _describe(exc: ValidationError, node: yaml.Node | None, path: Path) -> list[str]:
    problems = []
    for error in exc.errors(include_url=False):
        raw = tuple(error["loc"])
        # a source's kind is a tagged union: pydantic puts the tag (postgres/jdbc) in the location
        source_kind = raw[2] if len(raw) > 2 and raw[0] == "sources" and raw[2] in SOURCE_MODELS else None
        loc = _strip_union_tags(raw[:2] + raw[3:] if source_kind else raw)
        field = _format_loc(loc)
        line = _line_of(node, loc)
        where = f"{path.name}:{line}" if line else path.name
        message = _explain(error, loc, str(source_kind) if source_kind else None)
        problems.append(f"{where}: {field or '(top level)'}: {message}")
    return problems


def _strip_union_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    # pydantic inserts type tags such as 'list[str]' into locations of union members
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"str", "int"})))


def _format_loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _explain(error: Any, loc: tuple[int | str, ...], source_kind: str | None = None) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        if source_kind is not None and len(loc) == 3:
            allowed = sorted(SOURCE_MODELS[source_kind].model_fields)
        else:
            allowed = _allowed_keys(loc[:-1])
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"unknown key '{loc[-1]}'{hint}"
    if kind == "missing":
        return "required field is missing"
    message = str(error["msg"])
    # pydantic prefixes messages from our validators with "Value error, "
    return message.removeprefix("Value error, ")


def _allowed_keys(loc: Sequence[int | str]) -> list[str]:
    """Walk the model along ``loc`` to list the keys allowed where an unknown one was found."""
    model: type[BaseModel] | None = PlatformConfig
    annotation: Any = None
    for part in loc:
        if isinstance(part, str) and model is not None and part in model.model_fields:
            annotation = model.model_fields[part].annotation
        elif annotation is not None:  # an index into a list or a key of a dict: step into it
            args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
            annotation = args[-1] if args else None
        else:
            return []
        model = _model_in(annotation)
    return sorted(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """1-based line of the deepest YAML node that ``loc`` reaches."""
    current = node
    best: int | None = current.start_mark.line + 1 if current is not None else None
    for part in loc:
        if isinstance(current, yaml.MappingNode):
            nxt = None
            for key_node, value_node in current.value:
                if key_node.value == part:
                    # for an unknown key, point at the key itself
                    best = key_node.start_mark.line + 1
                    nxt = value_node
                    break
            if nxt is None:
                return best
            current = nxt
        elif isinstance(current, yaml.SequenceNode) and isinstance(part, int) and part < len(current.value):
            current = current.value[part]
        else:
            return best
        best = current.start_mark.line + 1
    return best
