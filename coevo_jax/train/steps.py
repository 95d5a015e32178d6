"""Jitted train steps: gradient accumulation over micro-batches, one AdamW update, device-scalar metrics.

The steps are module-level pure functions of (`TrainState`, batch); `build_steps` jits them once per
policy architecture and mesh with explicit in/out shardings and the state donated. Both co-evolving
policies share one architecture and mesh, hence one set of compiled programs (one per bucket shape).

Batches are in device layout [K, rows, ...] (`coevo_jax.sharding.device_layout`/`place_batch`): the K
micro-batches are scanned with `lax.scan`, gradients summed in float32 in the parameters' sharding, and
each micro-batch loss is pre-divided by the whole batch's normaliser, so k micro-batches give the same
update as one batch of k times the size.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from coevo_jax.models.decoder import bind
from coevo_jax.sharding import (
    PAIR_KEYS,
    SEQUENCE_KEYS,
    ShardingRules,
    activation_context,
    batch_spec,
    compute_shardings,
    replicated,
)
from coevo_jax.train.objectives import ObjectiveConfig, coevo_objective, dpo_objective, sft_objective
from coevo_jax.train.reference import reference_logprobs
from coevo_jax.train.state import TrainState

SFT_KEYS = (*SEQUENCE_KEYS, "example_mask")
DPO_KEYS = (*SEQUENCE_KEYS, *PAIR_KEYS)

Objective = Callable  # (model, micro_batch, normaliser, ObjectiveConfig) -> (loss share, metric sums)


def sft_normaliser(batch: dict) -> jax.Array:
    """Action tokens of the whole batch (all micro-batches): the denominator of the per-token eq. 3/5."""
    return jnp.maximum(jnp.sum(batch["loss_mask"].astype(jnp.float32)), 1.0)


def pair_normaliser(batch: dict) -> jax.Array:
    """Valid pairs of the whole batch: the denominator of eq. 7 and eq. 9."""
    return jnp.maximum(jnp.sum(batch["pair_mask"].astype(jnp.float32)), 1.0)


def accumulate_gradients(
    objective: Objective,
    normaliser: Callable[[dict], jax.Array],
    graphdef: nnx.GraphDef,
    params: dict,
    batch: dict,
    cfg: ObjectiveConfig,
    grad_shardings=None,
    compute_shardings=None,
) -> tuple[jax.Array, dict, dict]:
    """(batch loss, gradients, summed metrics) over the leading micro-batch axis of `batch`.

    `grad_shardings` keeps the float32 gradient sum in the parameters' (FSDP) sharding; `compute_shardings`
    is how the weights are gathered for the forward/backward pass (see `models.decoder.bind`).
    """
    total = normaliser(batch)

    def loss_fn(params, micro_batch):
        return objective(bind(graphdef, params, compute_shardings), micro_batch, total, cfg)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    keep_sharded = (
        (lambda g: g)
        if grad_shardings is None
        else functools.partial(jax.lax.with_sharding_constraint, shardings=grad_shardings)
    )

    def body(carry, micro_batch):
        loss_acc, grads_acc, sums_acc = carry
        (loss, sums), grads = grad_fn(params, micro_batch)
        grads_acc = keep_sharded(jax.tree.map(jnp.add, grads_acc, grads))
        return (loss_acc + loss, grads_acc, jax.tree.map(jnp.add, sums_acc, sums)), None

    first = jax.tree.map(lambda x: x[0], batch)
    sums_shape = jax.eval_shape(loss_fn, params, first)[1]
    init = (
        jnp.zeros((), jnp.float32),
        keep_sharded(jax.tree.map(jnp.zeros_like, params)),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape),
    )
    (loss, grads, sums), _ = jax.lax.scan(body, init, batch)
    return loss, grads, sums


def _pair_metrics(sums: dict) -> dict:
    pairs = jnp.maximum(sums["pair_count"], 1.0)
    out = {k.removesuffix("_sum"): v / pairs for k, v in sums.items() if k.endswith("_sum")}
    out["pairs"] = sums["pair_count"]
    return out


def train_step(
    state: TrainState,
    batch: dict,
    *,
    objective: Objective,
    normaliser: Callable[[dict], jax.Array],
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    cfg: ObjectiveConfig,
    mesh: Mesh,
    rules: ShardingRules,
    grad_shardings=None,
    compute_shardings=None,
    return_grads: bool = False,
) -> tuple[TrainState, dict]:
    """One optimizer update from a whole (micro-batched) batch; returns the new state and metrics.

    Metrics are device scalars (read them back only at the logging cadence); with `return_grads` they
    also hold the gradient tree under "grads" (for tests and debugging).
    """
    with activation_context(mesh, rules):
        loss, grads, sums = accumulate_gradients(
            objective, normaliser, graphdef, state.params, batch, cfg, grad_shardings, compute_shardings
        )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = TrainState(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = _pair_metrics(sums) if "pair_count" in sums else {"loss_tokens": sums["token_count"]}
    metrics.update(
        loss=loss,
        grad_norm=optax.global_norm(grads),
        learning_rate=jnp.asarray(schedule(state.step), jnp.float32),
        tokens=jnp.sum(batch["attention_mask"].astype(jnp.float32)),
    )
    if return_grads:
        metrics["grads"] = grads
    return new_state, metrics


class JittedStep:
    """A jitted function of (first argument, batch) that takes only its own batch entries.

    `compilations` counts the programs compiled so far (one per distinct bucket shape is the goal).
    """

    def __init__(self, fn: Callable, keys: tuple[str, ...]):
        self.jitted = fn
        self.keys = keys

    def __call__(self, first, batch: dict):
        missing = [k for k in self.keys if k not in batch]
        if missing:
            raise KeyError(f"batch lacks {missing}")
        return self.jitted(first, {k: batch[k] for k in self.keys})

    @property
    def compilations(self) -> int:
        return self.jitted._cache_size()


class StepKind(enum.Enum):
    """The three train steps, one per training equation of the paper (the value names the step)."""

    SFT = "sft"  # eq. 3 (token form eq. 5): behavioural cloning; base policies and RFT
    DPO = "dpo"  # eq. 7: DPO; the failure agent on D_fail, ETO and the positive agent on expert pairs
    COEVO = "coevo"  # eq. 9: per-pair weighted DPO + SFT on the chosen side; the target agent on D_tgt


@dataclasses.dataclass(frozen=True, eq=False)
class PolicySteps:
    """The compiled programs shared by the policies of one architecture on one mesh.

    `sft` (eq. 3/5), `dpo` (eq. 7) and `coevo` (eq. 9) map (TrainState, batch) -> (TrainState, metrics)
    and donate the state; `reference` maps (params, batch) -> (chosen, rejected) log-probs [K, P].
    """

    sft: JittedStep
    dpo: JittedStep
    coevo: JittedStep
    reference: JittedStep

    def step(self, kind: StepKind) -> JittedStep:
        """The train step of `kind`."""
        return {StepKind.SFT: self.sft, StepKind.DPO: self.dpo, StepKind.COEVO: self.coevo}[kind]


def _batch_shardings(keys: tuple[str, ...], mesh: Mesh, rules: ShardingRules) -> dict[str, NamedSharding]:
    ndim = lambda key: 3 if key in SEQUENCE_KEYS else 2
    return {key: NamedSharding(mesh, batch_spec(ndim(key), rules)) for key in keys}


def build_steps(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    shardings: TrainState,
    mesh: Mesh,
    rules: ShardingRules,
    cfg: ObjectiveConfig,
    *,
    return_grads: bool = False,
) -> PolicySteps:
    """Jits the three train steps and the reference pass with explicit shardings (state donated).

    With `return_grads` the step metrics also carry the gradients (replicated: for tests and debugging).
    """
    metric_sharding = replicated(mesh)
    weights_for_compute = compute_shardings(shardings.params, rules)

    def jit_step(objective, normaliser, keys):
        fn = functools.partial(
            train_step,
            objective=objective,
            normaliser=normaliser,
            graphdef=graphdef,
            tx=tx,
            schedule=schedule,
            cfg=cfg,
            mesh=mesh,
            rules=rules,
            grad_shardings=shardings.params,
            compute_shardings=weights_for_compute,
            return_grads=return_grads,
        )
        jitted = jax.jit(
            fn,
            in_shardings=(shardings, _batch_shardings(keys, mesh, rules)),
            out_shardings=(shardings, metric_sharding),
            donate_argnums=0,
        )
        return JittedStep(jitted, keys)

    pair_sharding = NamedSharding(mesh, batch_spec(2, rules))
    reference = jax.jit(
        functools.partial(
            reference_logprobs,
            graphdef=graphdef,
            cfg=cfg,
            mesh=mesh,
            rules=rules,
            compute_shardings=weights_for_compute,
        ),
        in_shardings=(shardings.params, _batch_shardings(SEQUENCE_KEYS, mesh, rules)),
        out_shardings=(pair_sharding, pair_sharding),
    )
    return PolicySteps(
        sft=jit_step(sft_objective, sft_normaliser, SFT_KEYS),
        dpo=jit_step(dpo_objective, pair_normaliser, DPO_KEYS),
        coevo=jit_step(coevo_objective, pair_normaliser, DPO_KEYS),
        reference=JittedStep(reference, SEQUENCE_KEYS),
    )
