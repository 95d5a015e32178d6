"""The main job on N processes: which process writes the workdir, where the processes wait for each other,
and how host values cross processes.

Every process runs the same program (SPMD) on one workdir that all of them see (one machine, or a file
system every host mounts; Orbax's collective checkpoints need that too). Process 0 alone writes the files
outside Orbax (stage records, results, reports, experts, the scratch tokenizer, merged rollout files); the
others wait at a barrier, then read what it wrote, so every process goes on from the same bytes.

A barrier (`jax.experimental.multihost_utils.sync_global_devices`) is named, and the names must agree
across processes, which catches processes that took different paths through the program. A write that
fails on process 0 leaves the others waiting at the next barrier: the launcher ends the job when one
process exits with an error (`launch/local_processes.sh`, `srun`, the TPU VM's runtime).

On CPU the cross-process collectives run over gloo, which gives a communicator (a set of devices) 30 s to
assemble the first time a program uses it: a process that is still compiling a train step when another
already waits in it would fail the run. `connect` opens every communicator of the mesh at once, with all
processes together, before any step runs.

With one process every helper is the plain single-process action: no barrier, no copy.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

T = TypeVar("T")


def count() -> int:
    return jax.process_count()


def rank() -> int:
    return jax.process_index()


def is_primary() -> bool:
    """Whether this process writes the workdir (process 0)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reached the barrier `name` (nothing with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def on_primary(name: str, write: Callable[[], object]) -> None:
    """`write()` on process 0 once every process has come this far (it may write what they produced or still
    read); past it every process can read what it wrote."""
    barrier(f"before {name}")
    if is_primary():
        write()
    barrier(name)


def primary_first(name: str, make: Callable[[], T]) -> T:
    """`make()` on process 0 first (it creates a file on its first run, e.g. the experts), then, past barrier
    `name`, on every other process (which finds the file and reads it)."""
    value = make() if is_primary() else None
    barrier(name)
    return value if is_primary() else make()


def to_host(tree):
    """A pytree of global arrays as NumPy arrays on every process (all-gathered when they span processes)."""
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)
    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)


def connect(mesh: Mesh) -> None:
    """Runs one all-reduce over every combination of `mesh`'s axes (see the module docstring)."""
    if jax.process_count() == 1:
        return
    names = tuple(mesh.axis_names)
    spec = PartitionSpec(names)
    ones = jax.make_array_from_callback(
        (mesh.size,), NamedSharding(mesh, spec), lambda index: np.ones(mesh.size, np.float32)[index]
    )
    barrier("connect")
    wide = [name for name in names if mesh.shape[name] > 1]
    for size in range(1, len(wide) + 1):
        for axes in itertools.combinations(wide, size):
            reduce = jax.shard_map(
                lambda x, axes=axes: jax.lax.psum(x, axes), mesh=mesh, in_specs=spec, out_specs=spec
            )
            jax.jit(reduce)(ones).block_until_ready()
    barrier("connected")
