"""Reading a YAML mapping safely, and turning pydantic's errors into one line a user can act on.

Shared by the accelerator catalog and the cluster profiles, so both fail the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sweep.errors import UserError


class _StrictSafeLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that rejects a key given twice.

    Plain YAML keeps the last one silently; a duplicated `env:` block would drop settings and change
    the benchmark without a word.
    """

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then overriding a key is intended
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def display_path(path: Path) -> str:
    """The path relative to the working directory when it lies under it (shorter errors), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_mapping(path: Path, kind: str) -> dict[str, Any]:
    """Load `path` as a YAML mapping. `kind` ("cluster profile", ...) starts every error message.

    Raises UserError for a missing or unreadable file, a YAML syntax error, a tag safe_load does not
    allow (`!!python/object`, ...), an empty file, or a document that is not a mapping.
    """
    where = display_path(path)
    if not path.is_file():
        raise UserError(f"{kind} file not found: {where}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {kind} {where}: {e}") from None
    try:
        data = yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise UserError(f"Invalid {kind} {where}: YAML error at {at}{e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise UserError(f"Invalid {kind} {where}: YAML error: {e}") from None
    if data is None:
        raise UserError(f"Invalid {kind} {where}: the file is empty; expected a mapping of keys")
    if not isinstance(data, dict):
        raise UserError(f"Invalid {kind} {where}: expected a mapping of keys, got a {type(data).__name__}")
    return data


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validation_message(err: ValidationError, model: type[BaseModel]) -> str:
    """All of pydantic's errors as `field: message (got value)`, joined into one line."""
    parts = []
    for e in err.errors():
        # pydantic marks a dict key's own error with a trailing "[key]"; the key already names it.
        field = ".".join(str(p) for p in e["loc"] if p != "[key]")
        # A ValueError from our validators arrives as "Value error, <ours>": keep only ours.
        message = str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"]
        if not field:  # a check across fields: its message names them, the input is the whole file
            parts.append(message)
        elif e["type"] == "extra_forbidden":
            parts.append(f"{field}: unknown key; valid keys: {', '.join(sorted(model.model_fields))}")
        elif e["type"] == "missing":
            parts.append(f"{field}: required key is missing")
        else:
            parts.append(f"{field}: {message} (got {_show(e['input'])})")
    return "; ".join(parts)
