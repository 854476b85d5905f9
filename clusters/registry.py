"""The registry of cluster profiles: every `clusters/<name>.yaml` beside this file, by name.

Modelled on SkyPilot's cloud registry: a name that is not there gets an error listing those that are.
A path to a YAML file works wherever a name does, so users copy a profile, edit it, and pass the path.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from clusters._load import display_path, read_mapping, unknown_name, validation_message
from clusters.catalog import CATALOG_PATH
from clusters.errors import ProfileError
from clusters.schema import ClusterProfile

PROFILES_DIR = Path(__file__).parent


def _profile_paths() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PROFILES_DIR.glob("*.yaml")) if p != CATALOG_PATH}


def profile_names() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(_profile_paths())


def _looks_like_path(name_or_path: str) -> bool:
    seps = {os.sep, "/"} | ({os.altsep} if os.altsep else set())
    return name_or_path.endswith((".yaml", ".yml")) or any(sep in name_or_path for sep in seps)


def load_profile(name_or_path: str) -> ClusterProfile:
    """The profile named `name_or_path`, or the one in the YAML file at that path.

    It is a path when it ends in .yaml/.yml or contains a path separator; otherwise a registry name.
    Raises ProfileError, in one line, for an unknown name, a missing or unparsable file, or a profile
    that breaks the schema (the message names the field, what was given and what is allowed).
    """
    if _looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
    else:
        paths = _profile_paths()
        if name_or_path not in paths:
            raise ProfileError(unknown_name("cluster", name_or_path, sorted(paths), "(or a path to a profile .yaml)"))
        path = paths[name_or_path]
    data = read_mapping(path, "cluster profile")
    try:
        return ClusterProfile.model_validate(data)
    except ValidationError as e:
        message = validation_message(e, ClusterProfile)
        if "models" in data:  # the likeliest way to get here: a grid file given as --cluster
            message = (
                f"this looks like a grid file (it has models:); a grid goes first, `sweep run GRID`, "
                f"and --cluster takes a cluster profile; {message}"
            )
        raise ProfileError(f"Invalid cluster profile {display_path(path)}: {message}") from None
