"""Errors that are the user's to fix. The CLI prints them as one line and exits 2, no traceback."""

from __future__ import annotations

import os
import sys


class UserError(Exception):
    """A mistake in the user's input: a file, a field, a value. The message names it and what is allowed."""


def user_error_types() -> tuple[type[Exception], ...]:
    """What the CLI prints as one line and exits 2 on: UserError, and the cluster profiles' own
    `clusters.errors.ProfileError` (clusters sits below sweep, so its error cannot be a UserError).

    ProfileError only once clusters is loaded: none can have been raised before, and importing clusters for the
    check would load the accelerator catalog in every command (`sweep results` imports none of it)."""
    profiles = sys.modules.get("clusters.errors")
    return (UserError,) if profiles is None else (UserError, profiles.ProfileError)


def one_line(message: str) -> str:
    """The message on one line: every run of whitespace, newlines included, one space."""
    return " ".join(str(message).split())


def debug_enabled() -> bool:
    """SWEEP_DEBUG=1 (or true/yes) brings tracebacks and Ray's logs back; unset, empty, 0 or false do not."""
    return os.environ.get("SWEEP_DEBUG", "").strip().lower() in ("1", "true", "yes")
