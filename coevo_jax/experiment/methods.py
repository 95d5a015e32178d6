"""The algorithms of the paper's Table 1 and its ablations, each a loop over `Stages`.

Every method returns its iterations as results.json entries (see `coevo_jax.reporting.results`):
iteration 0 is the SFT target policy's evaluation; each later iteration explores, builds pairs, trains
and evaluates the new target policy.

Each `run_<method>` says what its method does; `METHOD_RUNNERS` maps the method names of
`config.methods` to them.
"""

from __future__ import annotations

import functools

from coevo_jax.data import pairs as pair_builders
from coevo_jax.experiment import coevolve_loop
from coevo_jax.experiment.config import BEST_OF_N, COEVOLVE_METHODS
from coevo_jax.experiment.rollouts import failed_by_both, pairable, usable
from coevo_jax.experiment.stages import BASE, SFT_TARGET, Stages
from coevo_jax.train import StepKind


def _iteration(k: int, evaluation: dict, explore: dict | None = None, pairs=None, train=None) -> dict:
    entry = {"iteration": k, "eval": evaluation}
    if explore:
        entry["explore"] = explore
    if pairs:
        entry["pairs"] = pairs
    if train:
        entry["train"] = train
    return entry


def _evaluate(stages: Stages, policy: str, k: int, iterations: int) -> dict:
    """`stages.evaluate(policy)` after iteration `k`, or {} (no evaluation) before the last iteration when
    `env.eval_every_iteration` is off."""
    if k < iterations and not stages.setup.cfg.env.eval_every_iteration:
        return {}
    return stages.evaluate(policy)


def _pair_summary(record: dict) -> dict:
    dataset = record.get("dataset", {})
    return {
        "pairs": int(dataset.get("num_pairs", record.get("pairs", 0))),
        "hard_negatives": int(dataset.get("num_hard_negatives", 0)),
        "by_kind": dataset.get("pairs_by_kind", {}),
    }


def _train_summary(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("history", "dataset", "fit", "rounds")}


def _single_explorer_repeat(stages: Stages) -> int:
    """How often ETO and RFT play each task: twice with `match_exploration` (co-evolution has two agents)."""
    return 2 if stages.setup.cfg.match_exploration else 1


def run_zero_shot(stages: Stages, iterations: int, on_iteration) -> list[dict]:
    """The starting parameters evaluated untrained (iteration 0): a pretrained checkpoint's own skill, the row
    CoEvolve's tables start from."""
    entry = _iteration(0, stages.evaluate(BASE))
    on_iteration(entry)
    return [entry]


def run_sft(stages: Stages, iterations: int, on_iteration) -> list[dict]:
    """Behavioural cloning only (iteration 0; eq. 3/5)."""
    entry = _iteration(0, stages.evaluate(SFT_TARGET))
    on_iteration(entry)
    return [entry]


def run_rft(stages: Stages, iterations: int, on_iteration) -> list[dict]:
    """Each iteration adds the policy's own successes on the train tasks to the expert set (all iterations'
    successes so far) and fine-tunes the current policy on it with the SFT recipe."""
    current, successes = SFT_TARGET, []
    history = run_sft(stages, iterations, on_iteration)
    for k in range(1, iterations + 1):
        explored, summary = stages.explore(current, k, repeat=_single_explorer_repeat(stages))
        successes += [t for t in usable(explored) if t.reward >= 1.0]
        data = pair_builders.select_rft(stages.experts, successes)
        current, record = stages.train_sft(f"rft_it{k}_target", current, data, k)
        entry = _iteration(
            k,
            _evaluate(stages, current, k, iterations),
            {"target": summary},
            train={"target": _train_summary(record)},
        )
        entry["train"]["target"]["examples"] = len(data)
        on_iteration(entry)
        history.append(entry)
    return history


def _expert_pair_iterations(
    stages: Stages, iterations: int, on_iteration, *, name: str, repeat: int, build_pairs
) -> list[dict]:
    """The target alone: each iteration explores (`repeat` plays per task), pairs its pairable episodes with
    their tasks' experts by `build_pairs(experts, episodes)`, trains by DPO (eq. 7) and evaluates."""
    current = SFT_TARGET
    history = run_sft(stages, iterations, on_iteration)
    cut = stages.setup.cfg.dpo.pair_context_limited
    for k in range(1, iterations + 1):
        explored, summary = stages.explore(current, k, repeat=repeat)
        episodes = pairable(explored, context_limited=cut)
        current, record = stages.train_pairs(
            f"{name}_it{k}_target",
            current,
            functools.partial(build_pairs, stages.experts, episodes),
            kind=StepKind.DPO,
            iteration=k,
        )
        entry = _iteration(
            k,
            _evaluate(stages, current, k, iterations),
            {"target": summary},
            {"target": _pair_summary(record)},
            {"target": _train_summary(record)},
        )
        on_iteration(entry)
        history.append(entry)
    return history


def run_eto(stages: Stages, iterations: int, on_iteration) -> list[dict]:
    """Explore with the target policy, pair the expert with each prediction, DPO (eq. 7)."""
    cap = stages.setup.cfg.dpo.max_pairs_per_task
    return _expert_pair_iterations(
        stages,
        iterations,
        on_iteration,
        name="eto",
        repeat=_single_explorer_repeat(stages),
        build_pairs=functools.partial(pair_builders.build_eto_pairs, max_pairs_per_task=cap),
    )


def run_best_of_4(stages: Stages, iterations: int, on_iteration) -> list[dict]:
    """Best-of-4 (the latest version's sampling control): each iteration the target plays every train task
    4 times (`BEST_OF_N` episodes: `rollout.samples_per_task` x the repeat), and each task's highest-reward
    failure among them is the rejected side against the task's expert; DPO (eq. 7) with ETO's weights,
    epochs, lr and beta.

    Our reading of the authors' control: their page says only that 4 trajectories are sampled per instruction
    and selected by the highest environment reward. A selected success would tie with a perfect expert and
    make no pair, so the selection runs over the failures: the sampled negative closest to success. A task
    whose 4 episodes all succeed makes no pair. `match_exploration` does not apply (N fixes the budget).
    """
    return _expert_pair_iterations(
        stages,
        iterations,
        on_iteration,
        name="best_of_4",
        repeat=BEST_OF_N // stages.setup.cfg.rollout.samples_per_task,
        build_pairs=pair_builders.build_best_of_n_pairs,
    )


def _failure_agent_trains_on_failure_pairs(variant: str, iteration: int) -> bool:
    """Whether the failure agent of `variant` trains on D_fail (eq. 6-7) at `iteration`."""
    return variant in ("coevo", "coevo_expert_pairs") or (
        variant == "coevo_frozen_after_1" and iteration == 1
    )


def _failure_phase(stages: Stages, variant: str, k: int, failure: str, target_eps, failure_eps):
    """What the failure agent's seat does at iteration `k`: a callable giving (its policy after the
    iteration, its phase's record or None when it does not train)."""
    cap = stages.setup.cfg.dpo.max_pairs_per_task
    within = stages.setup.cfg.dpo.include_within_agent
    if _failure_agent_trains_on_failure_pairs(variant, k):
        make_pairs = functools.partial(
            pair_builders.build_failure_pairs,
            target_eps,
            failure_eps,
            include_within_agent=within,
            max_pairs_per_task=cap,
        )
    elif variant == "coevo_positive":
        make_pairs = functools.partial(
            pair_builders.build_positive_agent_pairs, stages.experts, failure_eps, max_pairs_per_task=cap
        )
    else:
        return lambda: (failure, None)
    return functools.partial(
        stages.train_pairs, f"{variant}_it{k}_failure", failure, make_pairs, kind=StepKind.DPO, iteration=k
    )


def run_coevo(stages: Stages, iterations: int, on_iteration, *, variant: str = "coevo") -> list[dict]:
    """Both agents explore; the failure agent trains by DPO on D_fail (eq. 6-7), the target on D_tgt by eq. 9.

    `variant`: 'coevo' (D_tgt of the paper's eq. 8); 'coevo_expert_pairs' (the authors' latest version: the
    expert vs each failure of either agent, eq. 9's expert weights, no failure-failure pairs); or an ablation:
    'coevo_positive' (a "positive agent" that learns as ETO does takes the failure agent's place),
    'coevo_frozen' (the failure agent stays the SFT policy, explores afresh every iteration, never trains),
    'coevo_frozen_after_1' (the latest version's "w/o co-evolution": it trains in iteration 1 only).

    `failure` is the policy in the failure agent's seat: the failure agent, the positive agent of
    'coevo_positive', or the SFT failure policy that 'coevo_frozen' never trains. Each iteration's entry
    also counts the explored train tasks both agents failed (`failed_by_both`): eq. 6's pairs come from those.
    """
    target, failure = SFT_TARGET, stages.base_sft("failure")
    cap, cut = stages.setup.cfg.dpo.max_pairs_per_task, stages.setup.cfg.dpo.pair_context_limited
    if variant == "coevo_expert_pairs":
        build_target = pair_builders.build_expert_failure_pairs
    else:
        build_target = pair_builders.build_target_pairs
    history = run_sft(stages, iterations, on_iteration)
    for k in range(1, iterations + 1):
        (target_eps, target_summary), (failure_eps, failure_summary) = stages.explore_pair(target, failure, k)
        both_failed = failed_by_both(target_eps, failure_eps)
        target_eps, failure_eps = (pairable(e, context_limited=cut) for e in (target_eps, failure_eps))
        pairs, train = {}, {}
        failure_phase = _failure_phase(stages, variant, k, failure, target_eps, failure_eps)
        target_phase = functools.partial(
            stages.train_pairs,
            f"{variant}_it{k}_target",
            target,
            functools.partial(build_target, stages.experts, target_eps, failure_eps, max_pairs_per_task=cap),
            kind=StepKind.COEVO,
            iteration=k,
        )
        (failure, failure_record), (target, record) = stages.pair(failure_phase, target_phase)
        if failure_record is not None:
            pairs["failure"], train["failure"] = _pair_summary(failure_record), _train_summary(failure_record)
        pairs["target"], train["target"] = _pair_summary(record), _train_summary(record)
        entry = _iteration(
            k,
            _evaluate(stages, target, k, iterations),
            {"target": target_summary, "failure": failure_summary},
            pairs,
            train,
        )
        entry["failed_by_both"] = both_failed
        on_iteration(entry)
        history.append(entry)
    return history


def run_grpo(stages: Stages, iterations: int, on_iteration) -> list[dict]:
    """Ours (the paper's RL row is PPO): each iteration runs `grpo.steps_per_iteration` GRPO steps (CoEvolve
    eq. 1, `experiment.grpo`) from the policy the last one ended with; the SFT target policy starts them and
    is the KL reference."""
    current = SFT_TARGET
    history = run_sft(stages, iterations, on_iteration)
    for k in range(1, iterations + 1):
        current, record = stages.train_grpo(f"grpo_it{k}_target", current, k)
        entry = _iteration(
            k, _evaluate(stages, current, k, iterations), train={"target": _train_summary(record)}
        )
        on_iteration(entry)
        history.append(entry)
    return history


def run_coevolve(stages: Stages, iterations: int, on_iteration, *, method: str = "coevolve") -> list[dict]:
    """CoEvolve (arXiv 2604.15840): `grpo`'s training on a task list that a CoEvolve round grows every
    `coevolve.every_steps` GRPO steps (`experiment.coevolve_loop`); each iteration's entry lists its rounds
    under `coevolve`. `method`: 'coevolve' or one of its ablations (`coevolve.ABLATIONS`: each signal alone,
    no verification, unguided exploration); its pool is in `<workdir>/<method>/`."""
    cfg = stages.setup.cfg
    env = stages.env_factory()
    try:  # every task of the evaluation splits, not only the evaluated ones: none may join the pool
        eval_tasks = {task for split in cfg.env.eval_splits for task in env.tasks(split)}
    finally:
        env.close()
    loop = coevolve_loop.CoEvolveLoop(
        method, cfg.coevolve, stages.store, stages.env_factory, stages.train_tasks, eval_tasks, cfg.seed
    )
    current = SFT_TARGET
    history = run_sft(stages, iterations, on_iteration)
    for k in range(1, iterations + 1):
        current, record = stages.train_grpo(f"{method}_it{k}_target", current, k, run=loop)
        for done in record["rounds"]:
            stages.on_scalars(f"coevolve/{method}", done["step"], coevolve_loop.round_scalars(done))
        entry = _iteration(
            k, _evaluate(stages, current, k, iterations), train={"target": _train_summary(record)}
        )
        entry["coevolve"] = record["rounds"]
        on_iteration(entry)
        history.append(entry)
    return history


# those that train from `sft_failure`
FAILURE_AGENT_METHODS = (
    "coevo",
    "coevo_positive",
    "coevo_frozen",
    "coevo_expert_pairs",
    "coevo_frozen_after_1",
)
# those whose pairs put an explored episode against its task's expert trajectory (eq. 7-8)
EXPERT_PAIR_METHODS = ("eto", "best_of_4", *FAILURE_AGENT_METHODS)

METHOD_RUNNERS = {
    "zero_shot": run_zero_shot,
    "sft": run_sft,
    "rft": run_rft,
    "eto": run_eto,
    "coevo": run_coevo,
    "coevo_positive": lambda s, n, cb: run_coevo(s, n, cb, variant="coevo_positive"),
    "coevo_frozen": lambda s, n, cb: run_coevo(s, n, cb, variant="coevo_frozen"),
    "coevo_expert_pairs": lambda s, n, cb: run_coevo(s, n, cb, variant="coevo_expert_pairs"),
    "coevo_frozen_after_1": lambda s, n, cb: run_coevo(s, n, cb, variant="coevo_frozen_after_1"),
    "best_of_4": run_best_of_4,
    "grpo": run_grpo,
    **{m: lambda s, n, cb, m=m: run_coevolve(s, n, cb, method=m) for m in COEVOLVE_METHODS},
}
