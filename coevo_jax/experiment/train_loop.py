"""The one update loop of every training phase (SFT, DPO, co-evolution, GRPO): restore or start the train
state, run the phase's steps with a progress bar, checkpoint, and always finish the checkpoint it started.

A phase supplies its step (`step(state, index) -> (state, record or None)`: one update for SFT and DPO, a
whole GRPO step of rollouts and updates for GRPO), where its checkpoints fall and what follows each step
(GRPO: its history file and task-pool bookkeeping). Batches reach the mesh through `place_batch`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from tqdm.auto import tqdm

from coevo_jax import checkpoints, sharding
from coevo_jax.data.batching import check_right_padded
from coevo_jax.experiment.policy import PolicySetup
from coevo_jax.train import abstract_state, train_state_from_params


def place_batch(setup: PolicySetup, batch: dict) -> dict:
    """A host batch on the run's mesh: checked right-padded where the model assumes it, split into its
    micro-batches, the rows this process's devices hold."""
    if setup.model_cfg.right_padded:  # what its attention assumes without checking on the device
        check_right_padded(batch["attention_mask"])
    layout = sharding.device_layout(batch, setup.cfg.num_microbatches)
    rows = sharding.process_rows(layout, setup.mesh, setup.rules)
    return sharding.place_batch(rows, setup.mesh, setup.rules)


def restore_or_start(setup: PolicySetup, manager, tx, shardings, trainable: dict):
    """(state, position, step): the manager's latest checkpoint restored with its loop position and step,
    or a fresh state of `trainable` (copied: steps donate their input) with (None, None)."""
    if manager.latest_step() is not None:
        target = abstract_state(setup.model_cfg, tx, shardings)
        state, position = checkpoints.restore(manager, target, base=setup.base_fingerprint)
        return state, position, manager.latest_step()
    return train_state_from_params(jax.tree.map(jnp.copy, trainable), tx, shardings), None, None


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Where a phase's checkpoints fall: every `every` steps, the last one too when `at_end` (a GRPO state
    continues in the next iteration), each waited for when `wait` (GRPO writes its history beside it)."""

    manager: Any
    base: str | None
    every: int
    at_end: bool = False
    wait: bool = False


def run_steps(
    state,
    step: Callable[[Any, int], tuple[Any, dict | None]],
    *,
    done: int,
    stop: int,
    origin: int = 0,
    checkpointing: Checkpointing,
    position: Callable[[int], checkpoints.LoopPosition],
    progress: dict,
    postfix: Callable[[dict], dict] = lambda record: {},
    after_step: Callable[[int], None] | None = None,
):
    """Steps `done` ... `stop` - 1 of a phase whose steps count from `origin`; returns the final state.

    After step i (0-based) the state is checkpointed as step i + 1 at `position(i)` where `checkpointing`
    says, then `after_step(i + 1)` runs. `progress`: tqdm's desc, unit and disable; `postfix(record)` its
    postfix for a step that returned a record. The manager is waited for and closed even when a step raises,
    so an interrupted phase still completes the checkpoint it started."""
    bar = tqdm(total=stop - origin, initial=done - origin, **progress)
    manager = checkpointing.manager
    try:
        for index in range(done, stop):
            state, record = step(state, index)
            if record is not None:
                bar.set_postfix(**postfix(record))
            bar.update(1)
            finished = index + 1
            if finished % checkpointing.every == 0 and (finished < stop or checkpointing.at_end):
                checkpoints.save(manager, finished, state, position(index), base=checkpointing.base)
                if checkpointing.wait:
                    manager.wait_until_finished()
            if after_step is not None:
                after_step(finished)
    finally:
        bar.close()
        manager.wait_until_finished()
        manager.close()
    return state
