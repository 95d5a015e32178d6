"""Mid-phase checkpoints of a training phase (Orbax) and export of a policy to a Hugging Face directory.

A checkpoint holds the `TrainState` of the policy being trained (parameters, optimizer state, step) plus
where the phase's update loop stands (`LoopPosition`: epoch, phase, batch) as JSON. Saving is asynchronous
and atomic (Orbax writes to a temporary directory and commits it when complete); restoring takes a target
of ShapeDtypeStructs with shardings (`train.abstract_state`), which may belong to a different mesh than
the one that saved.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils

from coevo_jax.models import ModelConfig, abstract_model, save_pretrained
from coevo_jax.train.state import TrainState

STATE_ITEM = "state"
POSITION_ITEM = "position"


@dataclasses.dataclass(frozen=True)
class LoopPosition:
    """Where a training phase's update loop stands: its epoch, its stage name, batches done in the epoch."""

    epoch: int
    phase: str
    step: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoopPosition:
        # Checkpoints written before this field was named `epoch` stored the epoch as "iteration".
        epoch = data["epoch"] if "epoch" in data else data["iteration"]
        return cls(epoch=int(epoch), phase=str(data["phase"]), step=int(data["step"]))


def make_manager(directory: str | os.PathLike, *, max_to_keep: int = 3, async_save: bool = True):
    """An Orbax CheckpointManager for mid-phase checkpoints under `directory` (created if missing)."""
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
    )
    return ocp.CheckpointManager(
        os.path.abspath(os.fspath(directory)), options=options, item_names=(STATE_ITEM, POSITION_ITEM)
    )


def save(
    manager: ocp.CheckpointManager,
    checkpoint_id: int,
    state: TrainState,
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


def restore(
    manager: ocp.CheckpointManager, target: TrainState, checkpoint_id: int | None = None
) -> tuple[TrainState, LoopPosition]:
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
