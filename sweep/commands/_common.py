"""Shared CLI plumbing: user errors become one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

import typer

from sweep.errors import UserError, debug_enabled, one_line

F = TypeVar("F", bound=Callable)


def user_errors(fn: F) -> F:
    """Print a UserError as `error: ...` and exit 2 without a traceback (SWEEP_DEBUG=1 keeps it).

    Anything else is a bug in sweep: it keeps its traceback and exits 1.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            if debug_enabled():
                raise
            print(f"error: {one_line(str(e))}", file=sys.stderr)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]
