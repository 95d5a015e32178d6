"""Mid-phase checkpoints of a training phase (Orbax) and export of a policy to a Hugging Face directory.

A checkpoint holds the `TrainState` of the policy being trained (parameters, optimizer state, step) plus
where the phase's update loop stands (`LoopPosition`: epoch, phase, batch) as JSON. Saving is asynchronous
and atomic (Orbax writes to a temporary directory and commits it when complete); restoring takes a target
of ShapeDtypeStructs with shardings (`train.abstract_state`), which may belong to a different mesh than
the one that saved.

Under LoRA the state holds only the adapters, so a checkpoint records which frozen base they belong to
(`base_fingerprint`, in the checkpoint's Orbax metadata), and restoring onto another base is an error.
Every checkpoint also records its parameter layout (`PARAM_LAYOUT`: the decoder's layers stacked on a
leading axis), so one written before the layers were stacked (per-layer `layers/0/...`) fails with an error
that says so instead of a tree mismatch deep in Orbax.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils

from coevo_jax.checkpoint_formats import save_pretrained
from coevo_jax.models import ModelConfig, abstract_model
from coevo_jax.train.state import TrainState

STATE_ITEM = "state"
POSITION_ITEM = "position"
BASE_METADATA_KEY = "lora_base"  # custom metadata of a checkpoint of adapters: the base's fingerprint
LAYOUT_METADATA_KEY = "param_layout"  # custom metadata of every checkpoint: how the parameters are arranged
PARAM_LAYOUT = "stacked_layers"  # the decoder's blocks as one [L, ...] array per weight (models.decoder)
_SAMPLES_PER_TENSOR = 64


class BaseMismatchError(ValueError):
    """Adapters were about to be restored onto a base other than the one they were trained on."""


class LayoutMismatchError(ValueError):
    """A checkpoint's parameters are arranged otherwise than this version's decoder (`PARAM_LAYOUT`)."""


def base_fingerprint(model_cfg: ModelConfig, base: dict) -> str:
    """A short digest naming a frozen base: its architecture and dtype, and exact values of its tensors.

    The values are 64 evenly spaced elements of every tensor, gathered exactly (no reduction), so the
    digest is the same on any mesh and any number of processes, and costs no pass over the whole base.
    """
    samples = _gather_to_host(jax.jit(lambda p: jax.tree.map(_spaced_elements, p))(base))
    architecture = model_cfg.without_lora().replace(
        dtype="float32", remat=False, attention="auto"
    )  # not how it computes
    digest = hashlib.sha256(repr(architecture).encode())
    for path, values in sorted(jax.tree_util.tree_leaves_with_path(samples), key=lambda x: str(x[0])):
        digest.update(f"{jax.tree_util.keystr(path)}:{values.dtype}".encode())
        digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()[:16]


def _spaced_elements(x: jax.Array) -> jax.Array:
    positions = np.linspace(0, x.size - 1, min(x.size, _SAMPLES_PER_TENSOR)).astype(np.int64)
    return x.reshape(-1)[positions]


def checkpoint_metadata(base: str | None) -> dict:
    """The Orbax custom metadata of a checkpoint: the parameter layout and, under LoRA, `base` (a
    `base_fingerprint`)."""
    return {LAYOUT_METADATA_KEY: PARAM_LAYOUT, **({} if base is None else {BASE_METADATA_KEY: base})}


def check_metadata(metadata: dict | None, base: str | None, where: str) -> None:
    """Raises `LayoutMismatchError` unless checkpoint `where` (its custom `metadata`) holds this version's
    parameter layout, and `BaseMismatchError` unless it belongs to `base`."""
    layout = (metadata or {}).get(LAYOUT_METADATA_KEY)
    if layout != PARAM_LAYOUT:
        raise LayoutMismatchError(
            f"{where}: parameters saved in layout {layout!r} (None: per-layer 'layers/0/...', written before "
            f"the decoder's layers were stacked); this version reads only {PARAM_LAYOUT!r}: rerun that stage "
            "in a fresh workdir"
        )
    saved = (metadata or {}).get(BASE_METADATA_KEY)
    if saved != base:
        raise BaseMismatchError(
            f"{where}: saved for LoRA base {saved!r}, restoring onto base {base!r} "
            "(None: full fine-tuning); use the base and LoRA settings it was trained with"
        )


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


# Orbax keeps process-wide state that two saves from two threads at once corrupt (temporary directories of
# one checkpoint vanishing under another's commit): stages that run side by side (`experiment.agent_pairs`)
# save and restore under this lock, synchronously.
ORBAX_LOCK = threading.RLock()


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
    base: str | None = None,
) -> bool:
    """Starts saving (returns once the arrays are copied; the write goes on in the background unless the
    manager saves synchronously).

    `base` is the `base_fingerprint` of the frozen base when `state` trains LoRA adapters."""
    with ORBAX_LOCK:
        return manager.save(
            checkpoint_id,
            args=ocp.args.Composite(
                **{
                    STATE_ITEM: ocp.args.StandardSave(state),
                    POSITION_ITEM: ocp.args.JsonSave(position.to_json()),
                }
            ),
            force=force,
            custom_metadata=checkpoint_metadata(base),
        )


def restore(
    manager: ocp.CheckpointManager,
    target: TrainState,
    checkpoint_id: int | None = None,
    *,
    base: str | None = None,
) -> tuple[TrainState, LoopPosition]:
    """(state placed in `target`'s shardings, loop position) of a checkpoint (default: the latest).

    `base`: the fingerprint of the LoRA base the state must belong to (None: full fine-tuning); a
    checkpoint saved for another base raises `BaseMismatchError`, one in another parameter layout
    `LayoutMismatchError`."""
    checkpoint_id = manager.latest_step() if checkpoint_id is None else checkpoint_id
    if checkpoint_id is None:
        raise FileNotFoundError(f"{manager.directory}: no checkpoint to restore")
    where = f"{manager.directory}/{checkpoint_id}"
    with ORBAX_LOCK:
        check_metadata(manager.metadata(checkpoint_id).custom_metadata, base, where)
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

    `dtype` (e.g. "bfloat16") converts the stored weights; default keeps the parameter dtype. A LoRA
    policy is written with its adapters merged into the base (`save_pretrained`).
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
