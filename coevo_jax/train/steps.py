"""Jitted train steps: gradient accumulation over micro-batches, one AdamW update, device-scalar metrics.

The steps are module-level pure functions of (`TrainState`, batch, `PhaseScalars`, frozen parameters);
`build_steps` jits them once per policy architecture, mesh and AdamW settings with explicit in/out
shardings and the state donated. What differs between phases (the learning-rate schedule, DPO's beta) comes
in as traced scalars, so both co-evolving policies and all their phases share one set of compiled programs
(one per bucket shape). Under LoRA the state holds only the adapters and the frozen base comes as its own
argument (never donated: both agents and every reference share it); gradients and optimizer moments exist
for the adapters alone. Without LoRA the frozen part is empty.

The LoRA adapters' dropout draws its masks from the update count and the micro-batch index, so a phase
resumed from a checkpoint replays the same masks.

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

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, traverse_util
from jax.sharding import Mesh, NamedSharding

from coevo_jax.models import bind, combine_trainable
from coevo_jax.sharding import (
    PAIR_KEYS,
    SEQUENCE_KEYS,
    ShardingRules,
    activation_context,
    batch_spec,
    compute_shardings,
    replicated,
)
from coevo_jax.train.objectives import (
    ObjectiveConfig,
    coevo_objective,
    dpo_objective,
    grpo_objective,
    sft_objective,
)
from coevo_jax.train.optim import LearningRateSchedule, OptimizerConfig, learning_rate, learning_rate_schedule
from coevo_jax.train.reference import reference_logprobs, reference_token_logprobs
from coevo_jax.train.state import TrainState

SFT_KEYS = (*SEQUENCE_KEYS, "example_mask")
DPO_KEYS = (*SEQUENCE_KEYS, *PAIR_KEYS)
TOKEN_KEYS = (*SEQUENCE_KEYS, "old_logps", "ref_logps")  # [K, rows, L] entries; the rest are [K, rows]


def grpo_keys(beta: float) -> tuple[str, ...]:
    """A GRPO batch's entries; with `beta` 0 it carries no reference log-probs (no reference pass)."""
    return (*SEQUENCE_KEYS, "old_logps", "advantages", "example_mask", *(("ref_logps",) if beta > 0 else ()))


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


class JittedStep:
    """A jitted function of (first argument, batch) that takes only its own batch entries.

    `compilations` counts the programs compiled so far (one per distinct bucket shape is the goal).
    """

    def __init__(self, fn: Callable, keys: tuple[str, ...]):
        self.jitted = fn
        self.keys = keys

    def _own(self, batch: dict) -> dict:
        missing = [k for k in self.keys if k not in batch]
        if missing:
            raise KeyError(f"batch lacks {missing}")
        return {k: batch[k] for k in self.keys}

    def __call__(self, first, batch: dict):
        return self.jitted(first, self._own(batch))

    @property
    def compilations(self) -> int:
        return self.jitted._cache_size()


class JittedTrainStep(JittedStep):
    """A jitted train step of (TrainState, batch, PhaseScalars, frozen parameters); `frozen` is {} without
    LoRA."""

    def __init__(self, fn: Callable, keys: tuple[str, ...], frozen_shardings: dict):
        super().__init__(fn, keys)
        self._frozen_structure = jax.tree.structure(frozen_shardings)

    def _frozen(self, frozen: dict | None) -> dict:
        frozen = {} if frozen is None else frozen
        if jax.tree.structure(frozen) != self._frozen_structure:
            what = "the LoRA base (frozen parameters)" if self._frozen_structure.num_leaves else "nothing"
            raise ValueError(f"this train step's frozen argument must be {what}")
        return frozen

    def __call__(self, state: TrainState, batch: dict, scalars: PhaseScalars, frozen: dict | None = None):
        return self.jitted(state, self._own(batch), scalars, self._frozen(frozen))

    def lower(self, state: TrainState, batch: dict, scalars: PhaseScalars, frozen: dict | None = None):
        """The step lowered for these (possibly abstract) arguments: `.compile().memory_analysis()`."""
        return self.jitted.lower(state, self._own(batch), scalars, self._frozen(frozen))


class StepKind(enum.Enum):
    """The train steps, one per training equation (the value names the step)."""

    SFT = "sft"  # eq. 3 (token form eq. 5): behavioural cloning; base policies and RFT
    DPO = "dpo"  # eq. 7: DPO; the failure agent on D_fail, ETO and the positive agent on expert pairs
    COEVO = "coevo"  # eq. 9: per-pair weighted DPO + SFT on the chosen side; the target agent on D_tgt
    GRPO = "grpo"  # CoEvolve eq. 1: clipped surrogate + k3 KL on sampled episodes (the `grpo` method)


@dataclasses.dataclass(frozen=True, eq=False)
class PolicySteps:
    """The compiled programs shared by the policies of one architecture on one mesh.

    `sft` (eq. 3/5), `dpo` (eq. 7), `coevo` (eq. 9) and `grpo` map (TrainState, batch, PhaseScalars,
    frozen) -> (TrainState, metrics) and donate the state; `reference` maps the whole policy's (params,
    batch) -> (chosen, rejected) log-probs [K, P] and `grpo_reference` to per-token log-probs [K, R, L] at
    GRPO's temperature, deterministically (no dropout).
    """

    sft: JittedTrainStep
    dpo: JittedTrainStep
    coevo: JittedTrainStep
    grpo: JittedTrainStep
    reference: JittedStep
    grpo_reference: JittedStep

    def step(self, kind: StepKind) -> JittedTrainStep:
        """The train step of `kind`."""
        steps = {StepKind.SFT: self.sft, StepKind.DPO: self.dpo, StepKind.COEVO: self.coevo}
        return {**steps, StepKind.GRPO: self.grpo}[kind]


def _frozen_part(param_shardings: dict, trainable_shardings: dict) -> dict:
    """The parameters of `param_shardings` that are not trainable (LoRA's base), as a sharding tree."""
    flat = traverse_util.flatten_dict(param_shardings)
    trainable = traverse_util.flatten_dict(trainable_shardings)
    return traverse_util.unflatten_dict({path: s for path, s in flat.items() if path not in trainable})


def _batch_shardings(keys: tuple[str, ...], mesh: Mesh, rules: ShardingRules) -> dict[str, NamedSharding]:
    ndim = lambda key: 3 if key in TOKEN_KEYS else 2
    return {key: NamedSharding(mesh, batch_spec(ndim(key), rules)) for key in keys}


def build_steps(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    shardings: TrainState,
    mesh: Mesh,
    rules: ShardingRules,
    cfg: ObjectiveConfig,
    *,
    param_shardings: dict | None = None,
    return_grads: bool = False,
) -> PolicySteps:
    """Jits the train steps and the reference passes with explicit shardings (state donated); each
    compiles on first use, once per bucket shape, whatever the phase's `PhaseScalars`.

    `param_shardings` are those of all the policy's parameters (`train.state.policy_shardings`); they
    default to the state's, which is right without LoRA. With `return_grads` the step metrics also carry
    the gradients (replicated: for tests and debugging).
    """
    scalar_sharding = replicated(mesh)
    param_shardings = shardings.params if param_shardings is None else param_shardings
    frozen_shardings = _frozen_part(param_shardings, shardings.params)
    weights_for_compute = compute_shardings(param_shardings, rules)

    def jit_step(objective, normaliser, keys):
        fn = functools.partial(
            train_step,
            objective=objective,
            normaliser=normaliser,
            graphdef=graphdef,
            tx=tx,
            cfg=cfg,
            mesh=mesh,
            rules=rules,
            grad_shardings=shardings.params,
            compute_shardings=weights_for_compute,
            return_grads=return_grads,
        )
        jitted = jax.jit(
            fn,
            in_shardings=(shardings, _batch_shardings(keys, mesh, rules), scalar_sharding, frozen_shardings),
            out_shardings=(shardings, scalar_sharding),
            donate_argnums=0,
        )
        return JittedTrainStep(jitted, keys, frozen_shardings)

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
        in_shardings=(param_shardings, _batch_shardings(SEQUENCE_KEYS, mesh, rules)),
        out_shardings=(pair_sharding, pair_sharding),
    )
    grpo_reference = jax.jit(
        functools.partial(
            reference_token_logprobs,
            graphdef=graphdef,
            cfg=cfg,
            mesh=mesh,
            rules=rules,
            compute_shardings=weights_for_compute,
        ),
        in_shardings=(param_shardings, _batch_shardings(SEQUENCE_KEYS, mesh, rules)),
        out_shardings=NamedSharding(mesh, batch_spec(3, rules)),
    )
    return PolicySteps(
        sft=jit_step(sft_objective, sft_normaliser, SFT_KEYS),
        dpo=jit_step(dpo_objective, pair_normaliser, DPO_KEYS),
        coevo=jit_step(coevo_objective, pair_normaliser, DPO_KEYS),
        grpo=jit_step(grpo_objective, grpo_normaliser(cfg.grpo.aggregation), grpo_keys(cfg.grpo.beta)),
        reference=JittedStep(reference, SEQUENCE_KEYS),
        grpo_reference=JittedStep(grpo_reference, SEQUENCE_KEYS),
    )
