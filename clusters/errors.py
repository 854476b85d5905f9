"""The one error the cluster profiles raise: a mistake in a YAML file the user wrote.

clusters sits below sweep and imports nothing of it; sweep treats this error as one of its user errors
(sweep.errors.user_error_types: one line, exit 2, no traceback).
"""

from __future__ import annotations


class ProfileError(Exception):
    """A mistake in a cluster profile, the accelerator catalog or another YAML file read as they are: the file
    (missing, unreadable, not a mapping), a key, a value. The message names it and what is allowed."""
