"""Building frozen config dataclasses from ConfigDicts or dicts at the library boundary."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def dataclass_from_mapping(cls: type[T], config: Mapping[str, Any], what: str) -> T:
    """`cls(**config)` for a subset of its field names; an unknown name is an error naming it and `what`."""
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = set(config) - names
    if unknown:
        raise ValueError(f"unknown {what} options {sorted(unknown)}")
    return cls(**dict(config))
