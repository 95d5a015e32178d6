"""Text environments behind one interface (`base.Environment`), created by name with `make`.

The registry maps names to `module:factory` strings, imported on first use, so environments with heavy
optional dependencies (ScienceWorld's JVM, WebShop) cost nothing until they are asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from coevo_jax.envs.base import Environment, ExpertStep, prompt_messages, record_expert_trajectory

_REGISTRY: dict[str, str | Callable[..., Environment]] = {
    "builtin": "coevo_jax.envs.builtin:BuiltinEnv",
    "intercode_sql": "coevo_jax.envs.intercode_sql:InterCodeSqlEnv",
    "sciworld": "coevo_jax.envs.sciworld:SciWorldEnv",
    "webshop": "coevo_jax.envs.webshop:WebShopEnv",
}


def register(name: str, factory: str | Callable[..., Environment]) -> None:
    """Registers a factory (a callable, or a 'module:attribute' string imported on first use)."""
    if name in _REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = factory


def names() -> tuple[str, ...]:
    """Registered environment names."""
    return tuple(sorted(_REGISTRY))


def make(name: str, **kwargs) -> Environment:
    """A new environment instance of the registered `name`, built with `kwargs`."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(names())}")
    factory = _REGISTRY[name]
    if isinstance(factory, str):
        module_name, attribute = factory.split(":")
        factory = getattr(importlib.import_module(module_name), attribute)
    return factory(**kwargs)


__all__ = [
    "Environment",
    "ExpertStep",
    "make",
    "names",
    "prompt_messages",
    "record_expert_trajectory",
    "register",
]
