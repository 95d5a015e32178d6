"""Meshes, logical-axis rules and placement of parameters and batches (data / FSDP / tensor parallelism).

Everything here is data plus small pure functions; meshes are always passed in, never read from globals.

* `MeshConfig` names the mesh axes and their sizes (one size may be -1: "all remaining devices").
* `ShardingRules` maps the decoder's logical axis names to mesh axes, separately for parameters and for
  activations: 'embed' is FSDP-sharded in a weight but must stay whole in an activation whose batch axis
  already uses 'fsdp'. A parameter dimension that does not divide its mesh axes is an error naming the
  parameter, never a silent replication.
* Batches carry a leading micro-batch axis [K, rows, ...]; rows are sharded over the batch mesh axes.
  DPO batches come from `coevo_jax.data.batching.collate_dpo` with each pair's two rows together, so
  micro-batching and multi-host feeding are plain reshapes/concatenations of whole pairs (`device_layout`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx, traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rule = tuple[str, str | tuple[str, ...] | None]

# Weights: FSDP over the model width, Megatron-style tensor parallelism over heads / MLP / vocabulary.
DEFAULT_PARAM_RULES: tuple[Rule, ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("lora_rank", None),  # LoRA adapters: sharded like their base weight on its other axes
    ("layers", None),  # stacked layers: the decoder's scan takes one layer per step, whole on every device
)
# Activations: batch rows over data x fsdp, heads / MLP / vocabulary over tensor.
DEFAULT_ACTIVATION_RULES: tuple[Rule, ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", None),
    ("heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
)

SEQUENCE_KEYS = ("input_ids", "attention_mask", "targets", "loss_mask")
PAIR_KEYS = ("lambda_dpo", "lambda_sft", "pair_mask", "ref_chosen_logps", "ref_rejected_logps")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh axes as (name, size) pairs; at most one size is -1 (filled with the remaining devices)."""

    axes: tuple[tuple[str, int], ...] = (("data", -1), ("fsdp", 1), ("tensor", 1))

    def __post_init__(self):
        object.__setattr__(self, "axes", tuple((str(n), int(s)) for n, s in self.axes))
        if sum(size == -1 for _, size in self.axes) > 1:
            raise ValueError(f"at most one mesh axis may have size -1: {self.axes}")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> MeshConfig:
        """From a ConfigDict/dict with `axes` as a sequence of (name, size) pairs."""
        return cls(axes=tuple(tuple(pair) for pair in config["axes"]))

    def shape(self, num_devices: int) -> tuple[int, ...]:
        """Axis sizes for `num_devices`; raises ValueError when they cannot multiply to it."""
        known = math.prod(size for _, size in self.axes if size != -1)
        sizes = [size if size != -1 else num_devices // max(known, 1) for _, size in self.axes]
        if math.prod(sizes) != num_devices or min(sizes) < 1:
            raise ValueError(f"mesh axes {self.axes} do not fit {num_devices} devices")
        return tuple(sizes)


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical-axis -> mesh-axis rules for parameters and for activations (both tuples of pairs)."""

    params: tuple[Rule, ...] = DEFAULT_PARAM_RULES
    activations: tuple[Rule, ...] = DEFAULT_ACTIVATION_RULES
    # Mesh axes that only shard the *storage* of weights (ZeRO-3 / FSDP): gathered for compute.
    storage_axes: tuple[str, ...] = ("data", "fsdp")

    def __post_init__(self):
        canon = lambda rules: tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in rules)
        object.__setattr__(self, "params", canon(self.params))
        object.__setattr__(self, "activations", canon(self.activations))
        object.__setattr__(self, "storage_axes", tuple(self.storage_axes))

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> ShardingRules:
        """From a ConfigDict/dict with optional `params`, `activations` (lists of pairs), `storage_axes`."""
        fields = {
            k: tuple(tuple(pair) for pair in config[k]) for k in ("params", "activations") if k in config
        }
        if "storage_axes" in config:
            fields["storage_axes"] = tuple(config["storage_axes"])
        return cls(**fields)

    @property
    def batch_axes(self) -> str | tuple[str, ...] | None:
        """Mesh axes of the batch rows (the 'batch' activation rule)."""
        return dict(self.activations).get("batch")


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over `devices` (default all) with Auto axes, so XLA propagates shardings between constraints."""
    devices = list(jax.devices() if devices is None else devices)
    names = tuple(name for name, _ in config.axes)
    auto = (jax.sharding.AxisType.Auto,) * len(names)
    return jax.make_mesh(config.shape(len(devices)), names, axis_types=auto, devices=devices)


def process_mesh_config(config: MeshConfig, rules: ShardingRules) -> MeshConfig:
    """The mesh of one process's own devices, for work that stays inside the process (its rollouts): the
    weight-storage axes (`rules.storage_axes`, data and FSDP) fold into the first of them (-1), every other
    axis keeps its size. Compute gathers the storage axes anyway, so a device computes on the same weight
    shards as on the global mesh; batch rows are spread over the process's devices."""
    fill = next((name for name, _ in config.axes if name in rules.storage_axes), None)
    if any(size == -1 for name, size in config.axes if name not in rules.storage_axes):
        fill = None  # a non-storage axis already takes the remaining devices
    return MeshConfig(
        tuple(
            (name, -1 if name == fill else 1 if name in rules.storage_axes else size)
            for name, size in config.axes
        )
    )


def spec_for(logical_axes: Sequence[str | None], rules: Sequence[Rule]) -> PartitionSpec:
    """PartitionSpec of logical axis names under `rules` (unknown names stay unsharded)."""
    mapping = dict(rules)
    return PartitionSpec(*(mapping.get(name) if name else None for name in logical_axes))


def _axis_size(mesh: Mesh, entry) -> int:
    if entry is None:
        return 1
    names = (entry,) if isinstance(entry, str) else entry
    return math.prod(mesh.shape[n] for n in names)


def checked_sharding(
    name: str, shape: Sequence[int], logical_axes: Sequence[str | None], mesh: Mesh, rules: Sequence[Rule]
) -> NamedSharding:
    """NamedSharding of one array; raises ValueError naming it when a dimension does not divide."""
    spec = spec_for(logical_axes, rules)
    for dim, (size, entry, logical) in enumerate(zip(shape, spec, logical_axes, strict=True)):
        parts = _axis_size(mesh, entry)
        if size % parts:
            raise ValueError(
                f"parameter {name!r}: dimension {dim} ({logical}={size}) does not divide mesh axes "
                f"{entry} of size {parts}; change the mesh or the '{logical}' rule"
            )
    return NamedSharding(mesh, spec)


def _path_name(path: tuple) -> str:
    return "/".join(str(p) for p in path)


def param_shardings(abstract_state: nnx.State, mesh: Mesh, rules: ShardingRules) -> dict:
    """Pure-dict tree of NamedShardings for an NNX parameter state (abstract or concrete)."""
    flat = {}
    for path, variable in nnx.to_flat_state(abstract_state):
        logical = variable.get_metadata().get("out_sharding") or (None,) * variable.get_value().ndim
        flat[path] = checked_sharding(
            _path_name(path), variable.get_value().shape, logical, mesh, rules.params
        )
    return traverse_util.unflatten_dict(flat)


def _without_axes(entry, axes: tuple[str, ...]):
    names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    kept = tuple(n for n in names if n not in axes)
    return None if not kept else kept[0] if len(kept) == 1 else kept


def compute_shardings(param_shardings, rules: ShardingRules):
    """Weight shardings for use in a step: storage-only (FSDP) axes gathered, tensor parallelism kept."""
    return jax.tree.map(
        lambda s: NamedSharding(
            s.mesh, PartitionSpec(*(_without_axes(e, rules.storage_axes) for e in s.spec))
        ),
        param_shardings,
    )


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on `mesh` (scalars, RNG keys, metrics)."""
    return NamedSharding(mesh, PartitionSpec())


def batch_spec(ndim: int, rules: ShardingRules) -> PartitionSpec:
    """[K, rows, ...]: the micro-batch axis whole, rows over the batch mesh axes, the rest whole."""
    return PartitionSpec(None, rules.batch_axes, *([None] * (ndim - 2)))


def batch_shardings(batch: Mapping[str, Any], mesh: Mesh, rules: ShardingRules) -> dict[str, NamedSharding]:
    """A NamedSharding per batch entry (each with a leading micro-batch axis)."""
    return {key: NamedSharding(mesh, batch_spec(np.ndim(value), rules)) for key, value in batch.items()}


@contextlib.contextmanager
def activation_context(mesh: Mesh, rules: ShardingRules):
    """Inside a traced step: make the decoder's logical activation constraints bind to `mesh`."""
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nnx.logical_axis_rules(rules.activations):
        yield


# --- Host-side batch layout -----------------------------------------------------------------------------


def device_layout(batch: Mapping[str, np.ndarray], num_microbatches: int = 1) -> dict[str, np.ndarray]:
    """A collated batch (`coevo_jax.data.batching`) in K micro-batches: [rows, ...] -> [K, rows/K, ...].

    Rows keep their order, so each DPO micro-batch holds whole pairs (a pair's two rows are adjacent) and
    the per-pair entries of exactly those pairs; a pair count K does not divide is an error.
    """
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        if value.shape[0] % num_microbatches:
            raise ValueError(
                f"{key}: {value.shape[0]} rows do not split into {num_microbatches} micro-batches"
            )
        out[key] = value.reshape(num_microbatches, value.shape[0] // num_microbatches, *value.shape[1:])
    return out


def process_rows(batch: Mapping[str, np.ndarray], mesh: Mesh, rules: ShardingRules) -> dict[str, np.ndarray]:
    """This process's part of a global batch in device layout that every process holds whole: the rows its
    devices hold, which it passes to `place_batch` (the whole batch on a single host). A mesh whose
    process does not hold one contiguous block of rows is an error."""
    if jax.process_count() == 1:
        return dict(batch)
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        sharding = NamedSharding(mesh, batch_spec(value.ndim, rules))
        spans = sorted(
            {
                idx[1].indices(value.shape[1])[:2]
                for idx in sharding.addressable_devices_indices_map(value.shape).values()
            }
        )
        start, stop = spans[0][0], spans[-1][1]
        if (
            sum(b - a for a, b in spans) != stop - start
            or (stop - start) * jax.process_count() != value.shape[1]
        ):
            raise ValueError(
                f"batch entry {key!r}: process {jax.process_index()} holds rows {spans}, not one block"
            )
        out[key] = value[:, start:stop]
    return out


def place_batch(batch: Mapping[str, np.ndarray], mesh: Mesh, rules: ShardingRules) -> dict[str, jax.Array]:
    """Global device arrays from this process's part of a batch (all of it on a single host).

    Each process passes its own rows (in device layout); the global batch is their concatenation along the
    row axis in process order.
    """
    shardings = batch_shardings(batch, mesh, rules)
    row_parts = _axis_size(mesh, rules.batch_axes)
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        rows = value.shape[1] * jax.process_count()
        if rows % row_parts:
            raise ValueError(
                f"batch entry {key!r}: {rows} rows per micro-batch do not divide the {row_parts} shards of "
                f"mesh axes {rules.batch_axes}; use a multiple of {row_parts} rows (or pairs) per micro-batch"
            )
        global_shape = (value.shape[0], rows, *value.shape[2:])
        out[key] = jax.make_array_from_process_local_data(shardings[key], value, global_shape)
    return out


# --- Multi-host ---------------------------------------------------------------------------------------------

DISTRIBUTED_ENV = "COEVO_DISTRIBUTED"


def maybe_initialize_distributed(environ: Mapping[str, str] = os.environ) -> bool:
    """Calls `jax.distributed.initialize()` when the launch sets COEVO_DISTRIBUTED=1; returns whether it did.

    Coordinator address, process count and id come from the cluster (TPU metadata, SLURM) or from
    JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID.
    """
    if environ.get(DISTRIBUTED_ENV, "0").lower() not in ("1", "true", "yes"):
        return False
    kwargs = {}
    if "JAX_COORDINATOR_ADDRESS" in environ:
        kwargs = dict(
            coordinator_address=environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(environ["JAX_NUM_PROCESSES"]),
            process_id=int(environ["JAX_PROCESS_ID"]),
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes (tests, one machine)
    jax.distributed.initialize(**kwargs)
    return True
