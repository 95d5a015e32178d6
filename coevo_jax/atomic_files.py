"""Atomic writes: a file or directory appears whole under its name, or not at all.

Every file the package writes outside Orbax (stage records, results, reports, experts, the task pool, the
scratch tokenizer, cached reference log-probs, exported checkpoints and adapters, the SQL databases, the
compiled CPU kernels) goes through `atomic_path`, so a kill at any moment leaves the old version or the new
one, never half of one, and a write that fails leaves no temporary behind. This module imports nothing from
the package, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, replace_directory: bool = False) -> Iterator[str]:
    """A temporary path to write `path`'s content to; renamed over `path` when the block completes.

    The temporary has `path`'s own name inside a fresh hidden directory beside `path` (same file system,
    so the rename is atomic; same suffix, so writers that go by it, like `np.savez` or the `.jsonl`
    writers, behave as for `path`). It may be written as a file or as a directory. If the block raises,
    `path` is left as it was and the temporary is removed.

    A plain rename replaces an existing file, but not a directory that holds files (it raises `OSError`).
    With `replace_directory`, an existing directory at `path` is replaced too (moved aside, the new one
    renamed in, the old one removed; moved back if the rename fails), and an existing non-directory at
    `path` is a `FileExistsError`.
    """
    path = os.path.abspath(os.fspath(path))
    name = os.path.basename(path)
    staging = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=f".{name}.", suffix=".tmp")
    try:
        tmp = os.path.join(staging, name)
        yield tmp
        if replace_directory and os.path.lexists(path):
            _replace_directory(tmp, path, os.path.join(staging, name + ".old"))
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace_directory(new_dir: str, target: str, old: str) -> None:
    """Moves `new_dir` to the existing directory `target`, keeping the old one at `old` until that succeeded."""
    if not os.path.isdir(target) or os.path.islink(target):
        raise FileExistsError(f"{target}: exists and is not a directory")
    os.replace(target, old)
    try:
        os.replace(new_dir, target)
    except BaseException:
        os.replace(old, target)
        raise
