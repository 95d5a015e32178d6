"""Atomic writes: a file or directory of the run appears whole under its name, or not at all.

Every file the main job writes outside Orbax (stage records, results, reports, experts, the scratch
tokenizer, cached reference log-probs) goes through `atomic_path`, so a kill at any moment leaves the old
version or the new one, never half of one, and a write that fails leaves no temporary behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary path to write `path`'s content to; renamed over `path` when the block completes.

    The temporary has `path`'s own name inside a fresh hidden directory beside `path` (same file system,
    so the rename is atomic; same suffix, so writers that go by it, like `np.savez` or the `.jsonl`
    writers, behave as for `path`). It may be written as a file or as a directory. If the block raises,
    `path` is left as it was and the temporary is removed.
    """
    path = os.path.abspath(os.fspath(path))
    name = os.path.basename(path)
    staging = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=f".{name}.", suffix=".tmp")
    try:
        tmp = os.path.join(staging, name)
        yield tmp
        os.replace(tmp, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
