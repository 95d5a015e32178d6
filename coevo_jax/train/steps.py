"""The train step as a pure function: gradient accumulation over micro-batches, one AdamW update, device-scalar
metrics.

`train_step` is a module-level pure function of (`TrainState`, batch, `PhaseScalars`, frozen parameters);
`compiled_steps.build_steps` jits it with explicit shardings. What differs between phases (the learning-rate
schedule, DPO's beta) comes in as traced scalars, so both co-evolving policies and all their phases share one
set of compiled programs. Under LoRA the state holds only the adapters and the frozen base comes as its own
argument; gradients and optimizer moments exist for the adapters alone. Without LoRA the frozen part is empty.

The LoRA adapters' dropout draws its masks from the update count and the micro-batch index, so a phase
resumed from a checkpoint replays the same masks.

Batches are in device layout [K, rows, ...] (`coevo_jax.sharding.device_layout`/`place_batch`): the K
micro-batches are scanned with `lax.scan`, gradients summed in float32 in the parameters' sharding, and
each micro-batch loss is pre-divided by the whole batch's normaliser, so k micro-batches give the same
update as one batch of k times the size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from coevo_jax.models import bind, combine_trainable
from coevo_jax.sharding import ShardingRules, activation_context
from coevo_jax.train.objectives import ObjectiveConfig
from coevo_jax.train.optim import LearningRateSchedule, OptimizerConfig, learning_rate, learning_rate_schedule
from coevo_jax.train.state import TrainState

Objective = Callable  # (model, micro_batch, normaliser, ObjectiveConfig, beta, dropout key) -> (share, sums)
_DROPOUT_SEED = 0  # the LoRA dropout key of update `step` is fold_in(key(_DROPOUT_SEED), step)


@flax.struct.dataclass
class PhaseScalars:
    """What a train step takes per phase as traced float32 scalars, so one compiled step serves every
    phase: the learning-rate schedule (evaluated at the state's step) and DPO's beta (eq. 7/9; the SFT and
    GRPO steps do not read it)."""

    schedule: LearningRateSchedule
    beta: jax.Array


def phase_scalars(optimizer: OptimizerConfig, beta: float) -> PhaseScalars:
    """The host scalars of a phase trained with `optimizer`'s schedule and DPO `beta`."""
    return PhaseScalars(schedule=learning_rate_schedule(optimizer), beta=np.asarray(beta, np.float32))


def sft_normaliser(batch: dict) -> jax.Array:
    """Action tokens of the whole batch (all micro-batches): the denominator of the per-token eq. 3/5."""
    return jnp.maximum(jnp.sum(batch["loss_mask"].astype(jnp.float32)), 1.0)


def pair_normaliser(batch: dict) -> jax.Array:
    """Valid pairs of the whole batch: the denominator of eq. 7 and eq. 9."""
    return jnp.maximum(jnp.sum(batch["pair_mask"].astype(jnp.float32)), 1.0)


def grpo_normaliser(aggregation: str) -> Callable[[dict], jax.Array]:
    """The whole batch's denominator of `losses.grpo_loss`'s `aggregation`: action tokens ("token_mean",
    as SFT), rows with an action token ("sequence_mean"), or rows x length ("sum_norm")."""

    def normaliser(batch: dict) -> jax.Array:
        mask = batch["loss_mask"].astype(jnp.float32)
        if aggregation == "token_mean":
            return jnp.maximum(jnp.sum(mask), 1.0)
        if aggregation == "sequence_mean":
            return jnp.maximum(jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)), 1.0)
        return jnp.asarray(float(mask.size), jnp.float32)

    return normaliser


def accumulate_gradients(
    objective: Objective,
    normaliser: Callable[[dict], jax.Array],
    graphdef: nnx.GraphDef,
    params: dict,
    batch: dict,
    cfg: ObjectiveConfig,
    beta: jax.Array,
    grad_shardings=None,
    compute_shardings=None,
    frozen: dict | None = None,
    dropout_key: jax.Array | None = None,
) -> tuple[jax.Array, dict, dict]:
    """(batch loss, gradients of `params`, summed metrics) over the leading micro-batch axis of `batch`.

    `params` are the trainable parameters and `frozen` the rest of the policy (LoRA's base; no gradient is
    formed for it). `beta` is DPO's (eq. 7/9). `grad_shardings` keeps the float32 gradient sum in the
    parameters' (FSDP) sharding; `compute_shardings` is how all the weights are gathered for the
    forward/backward pass (see `models.partition.bind`). `dropout_key` (micro-batch k uses fold_in(key, k))
    switches LoRA dropout on.
    """
    total = normaliser(batch)
    frozen = {} if frozen is None else frozen

    def loss_fn(params, micro_batch, key):
        model = bind(graphdef, combine_trainable(params, frozen), compute_shardings)
        return objective(model, micro_batch, total, cfg, beta, key)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    keep_sharded = (
        (lambda g: g)
        if grad_shardings is None
        else functools.partial(jax.lax.with_sharding_constraint, shardings=grad_shardings)
    )

    def body(carry, indexed):
        index, micro_batch = indexed
        loss_acc, grads_acc, sums_acc = carry
        key = None if dropout_key is None else jax.random.fold_in(dropout_key, index)
        (loss, sums), grads = grad_fn(params, micro_batch, key)
        grads_acc = keep_sharded(jax.tree.map(jnp.add, grads_acc, grads))
        return (loss_acc + loss, grads_acc, jax.tree.map(jnp.add, sums_acc, sums)), None

    first = jax.tree.map(lambda x: x[0], batch)
    sums_shape = jax.eval_shape(loss_fn, params, first, dropout_key)[1]
    init = (
        jnp.zeros((), jnp.float32),
        keep_sharded(jax.tree.map(jnp.zeros_like, params)),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape),
    )
    micro_batches = jnp.arange(jax.tree.leaves(batch)[0].shape[0])
    (loss, grads, sums), _ = jax.lax.scan(body, init, (micro_batches, batch))
    return loss, grads, sums


def _pair_metrics(sums: dict) -> dict:
    pairs = jnp.maximum(sums["pair_count"], 1.0)
    out = {k.removesuffix("_sum"): v / pairs for k, v in sums.items() if k.endswith("_sum")}
    out["pairs"] = sums["pair_count"]
    return out


def _grpo_metrics(sums: dict) -> dict:
    tokens = jnp.maximum(sums["token_count"], 1.0)
    out = {k.removesuffix("_sum"): v / tokens for k, v in sums.items() if k.endswith("_sum")}
    out.update(loss_tokens=sums["token_count"], episodes=sums["episode_count"])
    return out


def _metrics(sums: dict) -> dict:
    if "pair_count" in sums:
        return _pair_metrics(sums)
    if "episode_count" in sums:
        return _grpo_metrics(sums)
    return {"loss_tokens": sums["token_count"]}


def train_step(
    state: TrainState,
    batch: dict,
    scalars: PhaseScalars,
    frozen: dict,
    *,
    objective: Objective,
    normaliser: Callable[[dict], jax.Array],
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    cfg: ObjectiveConfig,
    mesh: Mesh,
    rules: ShardingRules,
    grad_shardings=None,
    compute_shardings=None,
    return_grads: bool = False,
) -> tuple[TrainState, dict]:
    """One optimizer update of the trainable parameters from a whole (micro-batched) batch, the `frozen`
    rest of the policy held fixed, at the learning rate of `scalars.schedule` for `state.step` (`tx` is
    AdamW at a unit rate); returns the new state and metrics.

    Metrics are device scalars (read them back only at the logging cadence); with `return_grads` they
    also hold the gradient tree under "grads" (for tests and debugging).
    """
    dropout_key = jax.random.fold_in(jax.random.key(_DROPOUT_SEED), state.step)
    with activation_context(mesh, rules):
        loss, grads, sums = accumulate_gradients(
            objective,
            normaliser,
            graphdef,
            state.params,
            batch,
            cfg,
            scalars.beta,
            grad_shardings,
            compute_shardings,
            frozen,
            dropout_key,
        )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    lr = learning_rate(scalars.schedule, state.step)
    updates = jax.tree.map(lambda u: lr.astype(u.dtype) * u, updates)
    new_state = TrainState(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = _metrics(sums)
    metrics.update(
        loss=loss,
        grad_norm=optax.global_norm(grads),
        learning_rate=lr,
        tokens=jnp.sum(batch["attention_mask"].astype(jnp.float32)),
    )
    if return_grads:
        metrics["grads"] = grads
    return new_state, metrics
