"""Reading a YAML mapping safely, and turning pydantic's errors into one line a user can act on.

Shared by the accelerator catalog and the cluster profiles, so both fail the same way.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from clusters.errors import ProfileError


class _StrictSafeLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type stubs here
    """`yaml.SafeLoader` that rejects a key given twice.

    Plain YAML keeps the last one silently; a duplicated `env:` block would drop settings and change
    the benchmark without a word.
    """

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
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

    Raises ProfileError for a missing or unreadable file, a YAML syntax error, a tag safe_load does not
    allow (`!!python/object`, ...), an empty file, or a document that is not a mapping.
    """
    where = display_path(path)
    if not path.is_file():
        raise ProfileError(f"{kind} file not found: {where}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"Invalid {kind} {where}: not a text (UTF-8 YAML) file") from None
    except OSError as e:
        raise ProfileError(f"cannot read {kind} {where}: {e}") from None
    try:
        data = yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ProfileError(f"Invalid {kind} {where}: YAML error at {at}{e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ProfileError(f"Invalid {kind} {where}: YAML error: {e}") from None
    if data is None:
        raise ProfileError(f"Invalid {kind} {where}: the file is empty; expected a mapping of keys")
    if not isinstance(data, dict):
        raise ProfileError(f"Invalid {kind} {where}: expected a mapping of keys, got a {type(data).__name__}")
    return data


def unknown_name(what: str, name: Any, valid: list[str], hint: str = "") -> str:
    """ "unknown model 'gpt-tny' — did you mean 'gpt-tiny'?", or the valid names when none is close.

    `hint` follows the list of valid names (e.g. "(or a path to a profile .yaml)").
    """
    close = difflib.get_close_matches(str(name), valid, n=1)
    if close:
        return f"unknown {what} {name!r} — did you mean {close[0]!r}?"
    return f"unknown {what} {name!r}; valid: {', '.join(valid)}{' ' + hint if hint else ''}"


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `list[...]`, `X | None`, `Annotated[X, ...]`, if there is one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType, typing.Annotated):
        return next((m for m in map(_model_in, typing.get_args(annotation)) if m is not None), None)
    return None


def _fields_by_key(model: type[BaseModel]) -> dict[str, Any]:
    """A model's fields by the key a YAML file gives them: the alias where there is one."""
    return {field.alias or name: field for name, field in model.model_fields.items()}


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the mapping that holds `loc`'s last part (nested models, lists of them)."""
    for part in loc[:-1]:
        if isinstance(part, str):  # list indices and pydantic's union tags leave the model as it is
            field = _fields_by_key(model).get(part)
            inner = field and _model_in(field.annotation)
            if inner is None:
                return []
            model = inner
    return sorted(_fields_by_key(model))


def validation_message(err: ValidationError, model: type[BaseModel]) -> str:
    """Every one of pydantic's errors as `field: message (got value)`, joined into one line.

    Unknown keys come first, with the closest valid key: a misspelt key also makes the key it meant
    "missing", and that consequence is left out rather than shown as a second mistake.
    """
    unknown: dict[str, list[str]] = {}  # each mapping's unknown keys, in order, by the path to that mapping
    unmatched: dict[str, list[str]] = {}  # the valid keys of each mapping with an unknown key that matched none
    other: list[tuple[tuple[Any, ...], str]] = []  # (where, text) of every other error
    missing: set[tuple[Any, ...]] = set()  # the places of required keys not given
    meant: set[tuple[Any, ...]] = set()  # the places an unknown key's closest valid key names
    for e in err.errors():
        # pydantic marks a dict key's own error with a trailing "[key]"; the key already names it.
        loc = tuple(p for p in e["loc"] if p != "[key]")
        field = ".".join(str(p) for p in loc)
        # A ValueError from our validators arrives as "Value error, <ours>": keep only ours.
        message = str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"]
        if e["type"] == "extra_forbidden":
            parent = ".".join(str(p) for p in loc[:-1])
            valid = _keys_at(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            meant.update((*loc[:-1], c) for c in close)
            if close:
                unknown.setdefault(parent, []).append(unknown_name("key", loc[-1], valid))
            else:  # the valid keys are listed once per mapping, after its unknown keys (not after each)
                unknown.setdefault(parent, []).append(f"unknown key {loc[-1]!r}")
                unmatched[parent] = valid
        elif e["type"] == "missing":
            other.append((loc, f"{field}: required key is missing"))
            missing.add(loc)
        elif not field:  # a check across fields: its message names them, the input is the whole file
            other.append((loc, message))
        else:
            shown = _show(e["input"])
            # a mapping is too long to repeat; a name our own message already quotes needs no repeat
            named = isinstance(e["input"], str) and shown in message
            got = "" if isinstance(e["input"], dict) or named else f" (got {shown})"
            if isinstance(e["input"], bool) and e["type"] in ("literal_error", "string_type"):
                got = f" (got {shown}: YAML reads an unquoted on/off/yes/no as a boolean; quote it)"
            other.append((loc, f"{field}: {message}{got}"))
    unknown_text = [
        f"{parent}: {text}" if parent else text
        for parent, texts in unknown.items()
        for text in texts + ([f"valid keys: {', '.join(unmatched[parent])}"] if parent in unmatched else [])
    ]
    return "; ".join(unknown_text + [text for loc, text in other if loc not in missing & meant])
