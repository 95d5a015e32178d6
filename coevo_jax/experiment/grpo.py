"""GRPO in the main job: one resumable phase per iteration, each `grpo.steps_per_iteration` GRPO steps.

A GRPO step (CoEvolve eq. 1, settings in `config.GRPOConfig`):

1. draws `tasks_per_step` train tasks (seeded by the run seed and the step, without replacement);
2. samples K episodes of each with the current policy at `grpo.temperature` (no top-p). The actor records
   every episode's exact token ids and the sampler's log-prob of each sampled token (`Trajectory.tokens`);
3. computes each task's group-relative advantages (`losses.group_advantages`) over its usable episodes
   (episodes that ended in an environment error or at the context limit are left out) and logs the fraction
   of groups whose rewards are all equal; with `advantage="gigpo"` each reply also gets its step-level
   advantage (`experiment.gigpo`); with `drop_equal_groups` the groups left without any advantage are
   dropped; the step logs how many episodes carried any signal;
4. trains on the episodes' recorded ids (`grpo_rows.sampled_sequence`, never re-tokenised): length-bucketed
   batches of `batch_size` episodes, each scored once by the reference (the SFT policy; skipped when
   `beta` is 0) and updated `updates_per_batch` (mu) times by the `StepKind.GRPO` step. The sampler's
   log-probs are the importance ratio's old log-probs, so a batch's first update has ratio 1 up to the
   sampler/trainer numerics (logged per step as `first_abs_log_ratio`).

One AdamW state (constant lr) carries over all steps and iterations: it is checkpointed with the step count
after every step under `<workdir>/<run>/state`, with the per-step records in `<workdir>/<run>/history.json`,
so a killed run resumes at its last finished step; the interrupted step's rollout file resumes too. `<run>`
is the `GrpoRun`'s name: `grpo` for the `grpo` method (`FixedTasks`), the method's name for the CoEvolve
methods (`experiment.coevolve_loop`), whose task list grows between steps. Every run draws step n's tasks
and samples its episodes with the same seeds (the run seed and n), so runs differ only by what they train on.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax import checkpoints, losses
from coevo_jax.data.batching import plan_batches
from coevo_jax.data.grpo_rows import collate_grpo, sampled_sequence
from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment
from coevo_jax.experiment import dead_groups, gigpo, processes, rollouts, train_loop
from coevo_jax.experiment.config import GRPOConfig
from coevo_jax.experiment.policy import PolicySetup
from coevo_jax.experiment.store import RunStore, read_json, write_json_atomic
from coevo_jax.models import combine_trainable, partition_trainable
from coevo_jax.train import OptimizerConfig, StepKind, phase_scalars

DEAD_PAIR_METRICS = ("loss", "reward_accuracy", "reward_margin", "grad_norm")
LOGGED_UPDATE_METRICS = ("loss", "ratio", "kl", "pg_loss", "clip_fraction", "grad_norm", "learning_rate")


class GrpoRun(Protocol):
    """What a GRPO run trains on and where it keeps its state: state in `<workdir>/<name>/state`, step records
    in `<workdir>/<name>/history.json`, step n's episodes in `rollouts/<name>_step<n>_explore.jsonl`."""

    name: str
    env_factory: Callable[[], Environment]  # a fresh environment that plays the tasks (one per actor slot)

    def tasks_at(self, step: int) -> Sequence[str]:
        """The tasks GRPO step `step` (0-based) draws from."""
        ...

    def after_steps(self, done: int) -> None:
        """Called with the number of finished steps once the state is restored, and after each step's
        checkpoint: work between steps, caught up after a kill."""
        ...

    def summary(self, first_step: int, last_step: int) -> dict:
        """Extra fields of the record of the iteration of steps `first_step + 1 ... last_step`."""
        ...


@dataclasses.dataclass(frozen=True)
class FixedTasks:
    """The `grpo` method's run: the same train tasks at every step, nothing between steps."""

    train_tasks: Sequence[str]
    env_factory: Callable[[], Environment]
    name: str = "grpo"

    def tasks_at(self, step: int) -> Sequence[str]:
        return self.train_tasks

    def after_steps(self, done: int) -> None:
        pass

    def summary(self, first_step: int, last_step: int) -> dict:
        return {}


def rollout_file(name: str, step: int) -> str:
    """The rollouts-relative file of run `name`'s GRPO step `step` (1-based) episodes."""
    return f"{name}_step{step}_explore.jsonl"


def step_tasks(tasks: Sequence[str], tasks_per_step: int, seed: int, step: int) -> list[str]:
    """The tasks of GRPO step `step` (0-based): a seeded draw without replacement from `tasks`, in their
    order (uniform: each task of the list as likely as any other)."""
    count = min(tasks_per_step, len(tasks))
    chosen = np.random.default_rng([seed, step]).choice(len(tasks), count, replace=False)
    return [tasks[i] for i in sorted(chosen.tolist())]


@dataclasses.dataclass(frozen=True)
class GroupStats:
    """What one step's groups (a task's K episodes) gave: counts of groups, episodes, and what was dropped."""

    groups: int
    equal_reward_groups: int  # all rewards equal: zero advantages, no policy-gradient signal
    dropped_groups: int  # groups without any advantage left out (`drop_equal_groups`)
    episodes: int
    unusable_episodes: int  # environment error or context limit: not in any group
    trained_episodes: int
    signal_episodes: int  # trained episodes with a nonzero advantage on some token: they carry a gradient
    over_long_dropped: int  # prompt plus first reply longer than max_length

    @property
    def equal_reward_fraction(self) -> float:
        return self.equal_reward_groups / max(self.groups, 1)

    def to_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "equal_reward_fraction": self.equal_reward_fraction}


def grpo_examples(
    trajectories: Sequence[Trajectory], cfg: GRPOConfig, max_length: int
) -> tuple[list, GroupStats]:
    """The training rows of one step (`SampledSequence`s with their group-relative advantages, per reply with
    GiGPO's step advantages added when `cfg.advantage` is "gigpo") and stats."""
    usable = [t for t in trajectories if rollouts.is_usable(t) and t.tokens is not None]
    members_of = dead_groups.task_groups(usable)
    rewards = [np.asarray([[t.reward for t in members]], np.float32) for members in members_of]
    episode = [np.asarray(losses.group_advantages(r, scale=cfg.advantage_scale))[0] for r in rewards]
    if cfg.advantage == "gigpo" and usable:
        steps = iter(gigpo.step_advantages([t for m in members_of for t in m], cfg))
        per_group = [[a + cfg.step_weight * next(steps) for a in group.tolist()] for group in episode]
    else:
        per_group = [group.tolist() for group in episode]
    trained, equal, dropped, over_long = [], 0, 0, 0
    for members, advantages in zip(members_of, per_group, strict=True):
        equal += len({t.reward for t in members}) == 1
        if cfg.drop_equal_groups and not any(np.any(np.asarray(a) != 0) for a in advantages):
            dropped += 1  # no advantage anywhere: nothing to learn (GiGPO may still find some)
            continue
        trained += zip(members, advantages, strict=True)
    examples, signal = [], 0
    for trajectory, advantage in trained:
        example = sampled_sequence(trajectory, advantage, max_length=max_length)
        if example is None:
            over_long += 1
            continue
        examples.append(example)
        signal += bool(np.any(example.token_advantages() != 0))
    stats = GroupStats(
        groups=len(members_of),
        equal_reward_groups=equal,
        dropped_groups=dropped,
        episodes=len(trajectories),
        unusable_episodes=len(trajectories) - len(usable),
        trained_episodes=len(examples),
        signal_episodes=signal,
        over_long_dropped=over_long,
    )
    return examples, stats


def _optimizer(cfg: GRPOConfig) -> OptimizerConfig:
    return OptimizerConfig(
        learning_rate=cfg.learning_rate, schedule="constant", warmup_steps=cfg.warmup_steps
    )


def _train_on(setup: PolicySetup, steps, state, frozen, reference, examples, seed: int):
    """Updates on one step's examples: (state, host metrics of the first and of the last update, updates)."""
    cfg = setup.cfg.grpo
    pad = setup.tokenizer.pad_token_id
    step_fn = steps.step(StepKind.GRPO)
    scalars = phase_scalars(_optimizer(cfg), beta=0.0)  # GRPO's KL weight is static: `cfg.beta`
    plan = plan_batches([len(e) for e in examples], cfg.batch_size, setup.cfg.buckets(), seed=seed)
    metrics = []
    for length, indices in plan:
        batch = collate_grpo(
            [examples[i] for i in indices], length=length, batch_size=cfg.batch_size, pad_id=pad
        )
        placed = train_loop.place_batch(setup, batch)
        if cfg.beta > 0:  # beta 0: no reference pass at all
            placed["ref_logps"] = steps.grpo_reference(reference, placed)
        for _ in range(cfg.updates_per_batch):
            state, update = step_fn(state, placed, scalars, frozen)
            metrics.append(update)
    first, last = ({k: float(v) for k, v in m.items()} for m in jax.device_get([metrics[0], metrics[-1]]))
    return state, first, last, len(metrics)


def grpo_phase(
    setup: PolicySetup,
    store: RunStore,
    name: str,
    start_params: dict,
    reference_params: dict | None,
    run: GrpoRun,
    *,
    iteration: int,
    seed: int,
) -> tuple[dict, dict]:
    """GRPO steps (iteration - 1) * S + 1 ... iteration * S (S = `grpo.steps_per_iteration`) of `run` from
    `start_params` (the SFT target at iteration 1; later iterations continue the saved GRPO state, which
    holds the same parameters), with the KL to `reference_params` (None when `grpo.beta` is 0). Returns
    (new params, summary with this iteration's per-step records as its `history`, and `run.summary`)."""
    cfg, grpo = setup.cfg, setup.cfg.grpo
    first_step, last_step = (iteration - 1) * grpo.steps_per_iteration, iteration * grpo.steps_per_iteration
    steps, tx, shardings = setup.programs.steps(_optimizer(grpo).adamw_settings())
    manager = checkpoints.make_manager(os.path.join(store.workdir, run.name, "state"), max_to_keep=1)
    history_path = os.path.join(store.workdir, run.name, "history.json")
    trainable, frozen = partition_trainable(start_params, setup.model_cfg)
    done = manager.latest_step()
    if done is not None and done > last_step:
        raise ValueError(f"{manager.directory}: GRPO state at step {done} is past iteration {iteration}")
    if (done or 0) < first_step:
        raise FileNotFoundError(f"{manager.directory}: no GRPO state at step {first_step} to continue from")
    state, _, done = train_loop.restore_or_start(setup, manager, tx, shardings, trainable)
    done = done or 0
    # records past the restored step belong to a step that did not reach its checkpoint: it is redone
    history = read_json(history_path)[:done] if os.path.exists(history_path) else []
    run.after_steps(done)

    def grpo_step(state, step: int):
        state, record = _one_step(
            setup, store, steps, state, frozen, reference_params, run, step, iteration, seed
        )
        history.append(record)
        if processes.is_primary():
            write_json_atomic(history_path, history)
        return state, record

    state = train_loop.run_steps(
        state,
        grpo_step,
        done=done,
        stop=last_step,
        origin=first_step,
        checkpointing=train_loop.Checkpointing(
            manager, setup.base_fingerprint, every=1, at_end=True, wait=True
        ),
        position=lambda step: checkpoints.LoopPosition(epoch=0, phase="grpo", step=step + 1),
        progress=dict(desc=name, unit="GRPO step", disable=not cfg.show_progress),
        postfix=lambda record: {"reward": f"{record['reward']:.3f}", "updates": record["updates"]},
        after_step=run.after_steps,
    )
    own = [record for record in history if first_step < record["step"] <= last_step]
    return combine_trainable(state.params, frozen), {
        **_summary(grpo, own),
        **run.summary(first_step, last_step),
    }


def _one_step(setup, store, steps, state, frozen, reference, run: GrpoRun, step, iteration, seed):
    """Rollouts of GRPO step `step` (0-based) with the current policy, then its updates: (state, record)."""
    grpo = setup.cfg.grpo
    trajectories = rollouts.play(
        setup,
        combine_trainable(state.params, frozen),
        run.env_factory,
        step_tasks(run.tasks_at(step), grpo.tasks_per_step, seed, step),
        store.path("rollouts", rollout_file(run.name, step + 1)),
        greedy=False,
        samples_per_task=grpo.samples_per_task,
        seed=rollouts.stage_seed(seed, f"grpo/step{step + 1}"),
        agent="target",
        iteration=iteration,
        temperature=grpo.temperature,
    )
    examples, stats = grpo_examples(trajectories, grpo, setup.cfg.max_length)
    summary = rollouts.summarize(trajectories)
    record = {"step": step + 1, "reward": summary["avg_reward"], "success_rate": summary["success_rate"]}
    record.update(stats.to_dict(), updates=0)
    dead = None
    if grpo.dead_groups == "pairs":
        usable = [t for t in trajectories if rollouts.is_usable(t)]
        dead = dead_groups.dead_group_pairs(
            dead_groups.task_groups(usable), max_pairs=grpo.dead_group_max_pairs
        )
        record.update(dead.stats(), dead_pair_updates=0)
        if dead.pairs and reference is None:  # no KL reference: the policy as this step sampled it
            reference = jax.tree.map(jnp.copy, combine_trainable(state.params, frozen))
    if examples:
        state, first, last, updates = _train_on(
            setup, steps, state, frozen, reference, examples, seed * 1000 + step
        )
        record.update(updates=updates, first_ratio=first["ratio"], first_abs_log_ratio=first["abs_log_ratio"])
        record.update({k: last[k] for k in LOGGED_UPDATE_METRICS})
    if dead is not None and dead.pairs:
        scalars = phase_scalars(_optimizer(grpo), beta=grpo.dead_group_beta)
        state, last, updates = dead_groups.train_pairs(
            setup,
            steps,
            state,
            frozen,
            reference,
            dead.pairs,
            scalars,
            buckets=setup.cfg.buckets(),
            place=lambda batch: train_loop.place_batch(setup, batch),
            seed=seed * 1000 + step,
        )
        record["dead_pair_updates"] = updates
        if last is not None:
            record.update({f"dead_pair_{k}": v for k, v in last.items() if k in DEAD_PAIR_METRICS})
    return state, record


def _summary(grpo: GRPOConfig, history: list[dict]) -> dict:
    """An iteration's record: its steps, episodes, mean reward, updates, the last step's metrics, history."""
    episodes = sum(record["episodes"] for record in history)
    weighted = lambda key: sum(r[key] * r["episodes"] for r in history) / max(episodes, 1)
    summary = {
        "steps": len(history),
        "updates": sum(record["updates"] for record in history),
        "episodes": episodes,
        "avg_reward": weighted("reward"),
        "success_rate": weighted("success_rate"),
        "equal_reward_fraction": sum(r["equal_reward_groups"] for r in history)
        / max(sum(r["groups"] for r in history), 1),
        # episodes whose tokens carried a nonzero advantage, of all sampled (records before the count: None)
        "signal_episode_fraction": sum(r.get("signal_episodes", 0) for r in history) / max(episodes, 1)
        if all("signal_episodes" in r for r in history)
        else None,
        "learning_rate": grpo.learning_rate,
        "beta": grpo.beta,
    }
    if grpo.dead_groups == "pairs":
        for key in ("dead_groups", "dead_group_pairs", "dead_pair_updates"):
            summary[key] = sum(record.get(key, 0) for record in history)
    trained = [record for record in history if record["updates"]]
    if trained:
        summary.update({f"final_{k}": trained[-1][k] for k in LOGGED_UPDATE_METRICS})
    # per step, for the GRPO steps figure: the sampled episodes' mean reward and success rate
    summary["step_rewards"] = [record["reward"] for record in history]
    summary["step_success_rates"] = [record["success_rate"] for record in history]
    summary["history"] = history
    return summary
