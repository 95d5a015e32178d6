"""Training phases of a run: SFT (eq. 3/5) on trajectories, DPO (eq. 7) or co-evolution (eq. 9) on pairs.

Each phase starts a fresh AdamW state from its start parameters (its learning-rate schedule and beta go to the
run's shared compiled steps as `PhaseScalars`), walks `epochs` seeded shuffles of its bucketed batches, and
saves a mid-phase checkpoint (TrainState + epoch/batch position) every `checkpoint_every_steps` updates, so a
killed run resumes inside the phase with the same batches in the same order. DPO phases compute the reference
log-probs (the policy as the phase starts: under LoRA, the shared base plus the adapters as they were) once
per pair before the first update and keep them on the host; every epoch's batches carry them. Every process
builds every batch whole and feeds the rows its devices hold (`sharding.process_rows`). Under LoRA the train
state holds the adapters only; the frozen base goes into every step beside it, and the checkpoints record
which base the adapters belong to.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np

from coevo_jax import checkpoints
from coevo_jax.atomic_files import atomic_path
from coevo_jax.data.batching import (
    collate_dpo,
    collate_sft,
    plan_batches,
    tokenize_pairs,
    tokenize_sft_examples,
)
from coevo_jax.experiment import processes, train_loop
from coevo_jax.experiment.policy import PolicySetup
from coevo_jax.experiment.store import RunStore
from coevo_jax.models import combine_trainable, partition_trainable
from coevo_jax.train import (
    MetricsLog,
    OptimizerConfig,
    StepKind,
    dpo_config,
    phase_scalars,
)

REFERENCE_FILE = "reference_logps.npz"


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
    """What one phase trains: its stage name, step kind, optimizer, beta (DPO's; unused by SFT), epochs and
    data-order seed."""

    name: str
    kind: StepKind
    optimizer: OptimizerConfig
    beta: float
    epochs: int
    seed: int


def sft_phase(
    setup: PolicySetup,
    store: RunStore,
    name: str,
    params: dict,
    trajectories: Sequence,
    *,
    seed: int,
    epochs: int | None = None,
) -> tuple[dict, dict]:
    """Behavioural cloning of `trajectories` from `params` for `epochs` (default `sft.epochs`);
    returns (new params, summary)."""
    cfg = setup.cfg
    epochs = epochs or cfg.sft.epochs
    examples, fit = tokenize_sft_examples(
        trajectories, setup.tokenizer, setup.chat_format, max_length=cfg.max_length
    )
    if not examples:
        raise ValueError(f"{name}: no SFT example fits max_length={cfg.max_length}")
    buckets, batch_size = setup.cfg.buckets(), cfg.sft.batch_size
    pad = setup.tokenizer.pad_token_id

    def epoch_batches(epoch: int) -> list[dict]:
        plan = plan_batches([len(e) for e in examples], batch_size, buckets, seed=seed * 1000 + epoch)
        return [
            collate_sft([examples[i] for i in idx], length=length, batch_size=batch_size, pad_id=pad)
            for length, idx in plan
        ]

    steps_per_epoch = len(plan_batches([len(e) for e in examples], batch_size, buckets, seed=0))
    total = max(epochs * steps_per_epoch, 2)
    warmup = min(int(cfg.sft.warmup_ratio * total), total - 1)
    optimizer = OptimizerConfig(
        learning_rate=cfg.sft.learning_rate, schedule="cosine", warmup_steps=warmup, total_steps=total
    )
    spec = PhaseSpec(name, StepKind.SFT, optimizer, 0.0, epochs, seed)
    params, summary = _train(setup, store, spec, params, epoch_batches, steps_per_epoch)
    return params, {**summary, "examples": len(examples), "fit": fit.to_dict()}


def dpo_phase(
    setup: PolicySetup,
    store: RunStore,
    name: str,
    params: dict,
    pairs: Sequence,
    *,
    kind: StepKind,
    learning_rate: float,
    beta: float,
    seed: int,
) -> tuple[dict, dict]:
    """A `StepKind.DPO` (eq. 7) or `StepKind.COEVO` (eq. 9) phase on `pairs` from `params`."""
    cfg = setup.cfg
    tokenized, fit = tokenize_pairs(pairs, setup.tokenizer, setup.chat_format, max_length=cfg.max_length)
    if not tokenized:
        return params, {"steps": 0, "pairs": 0, "fit": fit.to_dict(), "skipped": "no pairs"}
    buckets, per_batch = setup.cfg.buckets(), cfg.dpo.pairs_per_batch
    pad = setup.tokenizer.pad_token_id
    lengths = [len(p) for p in tokenized]
    spec = PhaseSpec(name, kind, dpo_config(learning_rate, cfg.dpo.warmup_steps), beta, cfg.dpo.epochs, seed)
    plans, total = dpo_phase_plans(
        lengths, per_batch, buckets, epochs=cfg.dpo.epochs, updates=cfg.dpo.updates_per_phase, seed=seed
    )
    steps_per_epoch, epochs = len(plans[0]), len(plans)
    # only the pairs the phase's `total` updates will see need reference log-probs
    trained = [idx for plan in plans for _, idx in plan][:total]
    used = sorted({i for idx in trained for i in idx})
    ref_chosen, ref_rejected = _reference_logps(setup, store, spec, params, tokenized, used)

    def epoch_batches(epoch: int) -> list[dict]:
        out = []
        for length, idx in plans[epoch]:
            batch = collate_dpo(
                [tokenized[i] for i in idx], length=length, pairs_per_batch=per_batch, pad_id=pad
            )
            rows = np.zeros(per_batch, np.int64)
            rows[: len(idx)] = idx
            batch["ref_chosen_logps"] = ref_chosen[rows]
            batch["ref_rejected_logps"] = ref_rejected[rows]
            out.append(batch)
        return out

    spec = dataclasses.replace(spec, epochs=epochs)
    params, summary = _train(setup, store, spec, params, epoch_batches, steps_per_epoch, total)
    return params, {**summary, "pairs": len(tokenized), "fit": fit.to_dict()}


def dpo_phase_plans(
    lengths: Sequence[int],
    pairs_per_batch: int,
    buckets: Sequence[int],
    *,
    epochs: int,
    updates: int | None,
    seed: int,
) -> tuple[list[list[tuple[int, tuple[int, ...]]]], int]:
    """The batches of each epoch a preference phase walks over its pairs (lengths in tokens), and its update
    count: `epochs` full passes, the paper's scheme (a larger pair set gets proportionally more updates), or,
    with `updates`, exactly that many (pairs cycled in fresh epochs, the last one cut short) for ablations
    that give every method the same number of updates."""
    if epochs < 1 and not updates:
        raise ValueError(f"dpo.epochs must be >= 1 (or dpo.updates_per_phase set), got {epochs}")
    steps_per_epoch = len(plan_batches(lengths, pairs_per_batch, buckets, seed=0))
    total = updates or epochs * steps_per_epoch
    plans = [
        plan_batches(lengths, pairs_per_batch, buckets, seed=seed * 1000 + e)
        for e in range(-(-total // steps_per_epoch))
    ]
    return plans, total


def kept_reference_logps(store: RunStore, name: str, pairs: int, summary: dict) -> list | None:
    """The reference log-probs (chosen, rejected) that phase `name` computed for each of its `pairs` pairs
    (None for a pair no update saw), from its cache in the phase dir: read them before the scratch is
    cleared. None when the cache is absent or a pair was dropped for length (the cache indexes the pairs
    that fit, not the pairs built)."""
    path = os.path.join(store.scratch_dir(name), REFERENCE_FILE)
    if (summary.get("fit") or {}).get("dropped") or summary.get("pairs") != pairs or not os.path.exists(path):
        return None
    with np.load(path) as saved:
        chosen, rejected = saved["chosen"], saved["rejected"]
        computed = saved["computed"] if "computed" in saved else np.ones(len(chosen), bool)
    if len(chosen) != pairs:
        return None
    return [
        (float(c), float(r)) if done else None for c, r, done in zip(chosen, rejected, computed, strict=True)
    ]


def _reference_logps(
    setup, store, spec: PhaseSpec, params, tokenized, used: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """log pi_ref of the chosen and rejected side of the pairs in `used` (float32 [P] each, 0 for the pairs
    no update of the phase sees), cached in the phase dir."""
    path = os.path.join(store.scratch_dir(spec.name), REFERENCE_FILE)
    if os.path.exists(path):
        with np.load(path) as saved:
            computed = saved["computed"] if "computed" in saved else np.ones(len(saved["chosen"]), bool)
            if len(saved["chosen"]) == len(tokenized) and computed[list(used)].all():
                return saved["chosen"], saved["rejected"]
    steps, _, _ = setup.programs.steps(spec.optimizer.adamw_settings())
    per_batch, pad = setup.cfg.dpo.pairs_per_batch, setup.tokenizer.pad_token_id
    chosen = np.zeros(len(tokenized), np.float32)
    rejected = np.zeros(len(tokenized), np.float32)
    computed = np.zeros(len(tokenized), bool)
    computed[list(used)] = True
    lengths = [len(tokenized[i]) for i in used]
    plan = plan_batches(lengths, per_batch, setup.cfg.buckets(), seed=0, shuffle=False)
    for length, positions in plan:
        idx = [used[p] for p in positions]
        batch = collate_dpo([tokenized[i] for i in idx], length=length, pairs_per_batch=per_batch, pad_id=pad)
        batch = {k: v for k, v in batch.items() if k in steps.reference.keys}
        placed = train_loop.place_batch(setup, batch)
        c, r = processes.to_host(steps.reference(params, placed))
        chosen[list(idx)] = np.asarray(c).reshape(-1)[: len(idx)]
        rejected[list(idx)] = np.asarray(r).reshape(-1)[: len(idx)]
    if processes.is_primary():
        with atomic_path(path) as tmp:
            np.savez(tmp, chosen=chosen, rejected=rejected, computed=computed)
    return chosen, rejected


def _train(
    setup: PolicySetup,
    store: RunStore,
    spec: PhaseSpec,
    params: dict,
    epoch_batches: Callable[[int], list[dict]],
    steps_per_epoch: int,
    total: int | None = None,
) -> tuple[dict, dict]:
    """The phase's updates through `train_loop.run_steps`, with mid-phase checkpoints; returns (params,
    summary of the last metrics). `total` updates (default: every batch of every epoch) may end the last
    epoch early."""
    cfg = setup.cfg
    steps, tx, shardings = setup.programs.steps(spec.optimizer.adamw_settings())
    step_fn, scalars = steps.step(spec.kind), phase_scalars(spec.optimizer, spec.beta)
    manager = (
        checkpoints.make_manager(  # synchronous beside the other agent's phase (`checkpoints.ORBAX_LOCK`)
            store.scratch_dir(spec.name) + "/state", max_to_keep=1, async_save=not setup.concurrent_agents
        )
    )
    total = total or spec.epochs * steps_per_epoch
    trainable, frozen = partition_trainable(params, setup.model_cfg)
    state, position, _ = train_loop.restore_or_start(setup, manager, tx, shardings, trainable)
    done = 0 if position is None else position.epoch * steps_per_epoch + position.step
    metrics_log, history, epochs = MetricsLog(every=cfg.log_every_steps), [], {}

    def update(state, index: int):
        epoch = index // steps_per_epoch
        if epoch not in epochs:  # an epoch's batches are built as the loop enters it
            epochs.clear()
            epochs[epoch] = epoch_batches(epoch)
        batch = epochs[epoch][index % steps_per_epoch]
        state, metrics = step_fn(state, train_loop.place_batch(setup, batch), scalars, frozen)
        host = metrics_log.push(index + 1, metrics)
        if host is not None:
            history.append(host)
        return state, host

    state = train_loop.run_steps(
        state,
        update,
        done=done,
        stop=total,
        checkpointing=train_loop.Checkpointing(manager, setup.base_fingerprint, cfg.checkpoint_every_steps),
        position=lambda index: checkpoints.LoopPosition(
            epoch=index // steps_per_epoch, phase=spec.name, step=index % steps_per_epoch + 1
        ),
        progress=dict(desc=spec.name, unit="step", disable=not cfg.show_progress),
        postfix=lambda host: {"loss": f"{host['loss']:.4f}"},
    )
    last = metrics_log.flush()
    if last is not None:
        history.append(last)
    summary = {"steps": total, "epochs": spec.epochs, "learning_rate": spec.optimizer.learning_rate}
    if spec.kind is not StepKind.SFT:
        summary["beta"] = spec.beta
    if last is not None:
        summary.update({f"final_{k}": v for k, v in last.items() if k not in ("step",)})
    summary["history"] = history
    return combine_trainable(state.params, frozen), summary
