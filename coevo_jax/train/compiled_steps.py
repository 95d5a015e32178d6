"""The compiled train steps and reference passes of one policy architecture on one mesh (`build_steps`).

`build_steps` jits `steps.train_step` once per training equation, with explicit in/out shardings and the
state donated, and the reference log-prob passes beside it; each program compiles on first use, once per
bucket shape, and serves both co-evolving policies and all their phases (what differs between phases comes
in as `steps.PhaseScalars`). The frozen LoRA base is never donated: both agents and every reference share
it. `PolicySteps` holds the programs by `StepKind`; `JittedStep` hands each program only its own batch entries.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable

import jax
import optax
from flax import nnx, traverse_util
from jax.sharding import Mesh, NamedSharding

from coevo_jax.sharding import (
    PAIR_KEYS,
    SEQUENCE_KEYS,
    ShardingRules,
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
from coevo_jax.train.reference import reference_logprobs, reference_token_logprobs
from coevo_jax.train.state import TrainState
from coevo_jax.train.steps import (
    PhaseScalars,
    grpo_normaliser,
    pair_normaliser,
    sft_normaliser,
    train_step,
)

SFT_KEYS = (*SEQUENCE_KEYS, "example_mask")
DPO_KEYS = (*SEQUENCE_KEYS, *PAIR_KEYS)
TOKEN_KEYS = (
    *SEQUENCE_KEYS,
    "old_logps",
    "ref_logps",
    "advantages",
)  # [K, rows, L] entries; the rest are [K, rows]


def grpo_keys(beta: float) -> tuple[str, ...]:
    """A GRPO batch's entries; with `beta` 0 it carries no reference log-probs (no reference pass)."""
    return (*SEQUENCE_KEYS, "old_logps", "advantages", "example_mask", *(("ref_logps",) if beta > 0 else ()))


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
