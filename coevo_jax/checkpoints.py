"""Checkpoints of the co-evolution loop (Orbax) and export of a policy to a Hugging Face directory.

A checkpoint holds one `CoevoState` - both policies' parameters and optimizer states and the RNG key - plus
the loop position (iteration, phase, step) as JSON. Saving is asynchronous and atomic (Orbax writes to a
temporary directory and commits it when complete); restoring takes a target of ShapeDtypeStructs with
shardings, which may belong to a different mesh than the one that saved.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils

from coevo_jax.models import ModelConfig, save_pretrained
from coevo_jax.sharding import replicated
from coevo_jax.train.policies import CoevoState
from coevo_jax.train.state import TrainState, abstract_model, abstract_state

STATE_ITEM = "state"
POSITION_ITEM = "position"


@dataclasses.dataclass(frozen=True)
class LoopPosition:
    """Where the co-evolution loop stands: iteration, phase name (e.g. 'sft', 'failure', 'target'), step."""

    iteration: int = 0
    phase: str = "sft"
    step: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoopPosition:
        return cls(iteration=int(data["iteration"]), phase=str(data["phase"]), step=int(data["step"]))


def make_manager(directory: str | os.PathLike, *, max_to_keep: int = 3, async_save: bool = True):
    """An Orbax CheckpointManager for co-evolution checkpoints under `directory` (created if missing)."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
    )
    return ocp.CheckpointManager(
        os.path.abspath(os.fspath(directory)), options=options, item_names=(STATE_ITEM, POSITION_ITEM)
    )


def save(
    manager: ocp.CheckpointManager,
    checkpoint_id: int,
    state: CoevoState,
    position: LoopPosition,
    *,
    force: bool = True,
) -> bool:
    """Starts saving (returns once the arrays are copied; the write goes on in the background)."""
    return manager.save(
        checkpoint_id,
        args=ocp.args.Composite(
            **{
                STATE_ITEM: ocp.args.StandardSave(state),
                POSITION_ITEM: ocp.args.JsonSave(position.to_json()),
            }
        ),
        force=force,
    )


def abstract_coevo_state(model_cfg: ModelConfig, tx, shardings: TrainState) -> CoevoState:
    """The restore target: shapes, dtypes and (new) shardings of both policies and the RNG key data."""
    policy = abstract_state(model_cfg, tx, shardings)
    mesh = jax.tree.leaves(shardings)[0].mesh
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(mesh))
    return CoevoState(target=policy, failure=policy, rng=rng)


def restore(
    manager: ocp.CheckpointManager, target: CoevoState, checkpoint_id: int | None = None
) -> tuple[CoevoState, LoopPosition]:
    """(state placed in `target`'s shardings, loop position) of a checkpoint (default: the latest)."""
    checkpoint_id = manager.latest_step() if checkpoint_id is None else checkpoint_id
    if checkpoint_id is None:
        raise FileNotFoundError(f"{manager.directory}: no checkpoint to restore")
    restored = manager.restore(
        checkpoint_id,
        args=ocp.args.Composite(
            **{STATE_ITEM: ocp.args.StandardRestore(target), POSITION_ITEM: ocp.args.JsonRestore()}
        ),
    )
    return restored[STATE_ITEM], LoopPosition.from_json(restored[POSITION_ITEM])


def _gather_to_host(params: dict) -> dict:
    """Parameters as host NumPy arrays on every process (multi-host arrays are all-gathered first)."""
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), params)
    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), params)


def export_policy(
    graphdef: nnx.GraphDef, params: dict, path: str | os.PathLike, *, tokenizer=None, dtype=None
) -> None:
    """Writes a policy as a Hugging Face checkpoint directory (process 0 writes; all must call).

    `dtype` (e.g. "bfloat16") converts the stored weights; default keeps the parameter dtype.
    """
    cfg: ModelConfig = nnx.merge(graphdef, params).config
    if dtype is not None:
        cfg = cfg.replace(param_dtype=dtype)
        graphdef, _ = abstract_model(cfg)
    host = jax.tree.map(lambda x: x.astype(cfg.param_dtype), _gather_to_host(params))
    if jax.process_index() == 0:
        save_pretrained(nnx.merge(graphdef, host), path, tokenizer)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("export_policy")
