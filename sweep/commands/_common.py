"""Shared CLI plumbing: user errors become one line on stderr and exit code 2; options several commands
share are declared once, as the fields of a dataclass."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import typer

from sweep.errors import debug_enabled, one_line, user_error_types

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Print a UserError as `error: ...` and exit 2 without a traceback (SWEEP_DEBUG=1 keeps it).

    Anything else is a bug in sweep: it keeps its traceback and exits 1.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except user_error_types() as e:
            if debug_enabled():
                raise
            print(f"error: {one_line(str(e))}", file=sys.stderr)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def flag(*param_decls: str, help: str) -> typer.models.OptionInfo:
    """A bool option: it takes no value (`--resume`, or `--progress/--no-progress` when no name is given).
    Typer puts a `<bool>` metavar beside every bool option in the help, as if it took one; an empty metavar
    shows none."""
    return typer.Option(*param_decls, help=help, metavar="")


def dataclass_options(skip: Collection[str] = ()) -> Callable[[F], F]:
    """Give a command the options a dataclass declares: its parameter annotated with that dataclass becomes,
    in that place, one option per field (each field typed ``Annotated[..., typer.Option(...)]``, its default
    the option's), but those in ``skip``; the command is called with the dataclass built from them.

    Typer reads no dataclass parameter as options, so the signature it reads is rewritten: a field
    added to the dataclass is an option on every command that takes it.
    """

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn, eval_str=True)
        name, group = next(
            (p.name, p.annotation)
            for p in signature.parameters.values()
            if isinstance(p.annotation, type) and dataclasses.is_dataclass(p.annotation)
        )
        hints = typing.get_type_hints(group, include_extras=True)
        fields = [
            inspect.Parameter(
                f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default, annotation=hints[f.name]
            )
            for f in dataclasses.fields(group)
            if f.name not in skip
        ]
        params = [q for p in signature.parameters.values() for q in (fields if p.name == name else [p])]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {f.name: kwargs.pop(f.name) for f in fields}
            return fn(*args, **kwargs, **{name: group(**values)})

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate
