"""Text environments behind one interface (`base.Environment`), created by name with `make`.

The registry maps names to `module:factory` strings, imported on first use, so environments with heavy
optional dependencies (ScienceWorld's JVM, WebShop, BFCL's `bfcl-eval`) cost nothing until they are asked for.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from coevo_jax.envs.base import (
    Environment,
    ExpertStep,
    TaskSpec,
    prompt_messages,
    record_expert_trajectory,
)

_REGISTRY: dict[str, str] = {
    "bfcl": "coevo_jax.envs.bfcl:BfclEnv",
    "builtin": "coevo_jax.envs.builtin:BuiltinEnv",
    "intercode_sql": "coevo_jax.envs.intercode_sql:InterCodeSqlEnv",
    "sciworld": "coevo_jax.envs.sciworld:SciWorldEnv",
    "webshop": "coevo_jax.envs.webshop:WebShopEnv",
}


def names() -> tuple[str, ...]:
    """Registered environment names."""
    return tuple(sorted(_REGISTRY))


def factory(name: str) -> Callable[..., Environment]:
    """The registered factory of `name` (its module imported, nothing constructed); ValueError if unknown."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(names())}")
    module_name, attribute = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), attribute)


def check_kwargs(name: str, kwargs: dict) -> None:
    """ValueError naming the environment when `make(name, **kwargs)` could not accept these arguments."""
    try:
        inspect.signature(factory(name)).bind(**kwargs)
    except TypeError as error:
        raise ValueError(f"environment {name!r}: {error} (env.kwargs: {sorted(kwargs)})") from None


def make(name: str, **kwargs) -> Environment:
    """A new environment instance of the registered `name`, built with `kwargs`."""
    return factory(name)(**kwargs)


__all__ = [
    "Environment",
    "ExpertStep",
    "TaskSpec",
    "check_kwargs",
    "factory",
    "make",
    "names",
    "prompt_messages",
    "record_expert_trajectory",
]
