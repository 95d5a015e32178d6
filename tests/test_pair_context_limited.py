"""`dpo.pair_context_limited`: episodes cut at the context limit make DPO pairs (ETO, co-evolution) or not.

The method runners run on fake stages that hand out fixed explorations and record the pairs each DPO phase
is given, so the test reads exactly which episodes each method paired.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from seeds import fresh_seed
from test_experiment import tiny_config

from coevo_jax.data.records import Message, Trajectory
from coevo_jax.experiment import methods, rollouts

REASONS = ("done", "max_steps", "context_limit", "env_error: RuntimeError: boom")


def _episode(task: str, agent: str, reward: float, reason: str) -> Trajectory:
    return Trajectory(
        traj_id=f"{task}/{agent}/{reason.split(':')[0]}",
        task_id=task,
        reward=reward,
        messages=(Message("user", f"task {task}"), Message("assistant", f"{agent} {reason}")),
        agent=agent,
        extra={"terminate_reason": reason},
    )


def _explorations(rng) -> dict[str, list[Trajectory]]:
    """Per agent one failure per task, each task's episodes ending for one reason (rewards distinct)."""
    explored = {"target": [], "failure": []}
    for i, reason in enumerate(REASONS):
        low, high = sorted(rng.choice(np.arange(1, 10), 2, replace=False) / 10)
        explored["target"].append(_episode(f"t{i}", "target", float(high), reason))
        explored["failure"].append(_episode(f"t{i}", "failure", float(low), reason))
    return explored


def _fake_stages(pair_context_limited: bool, explored: dict[str, list[Trajectory]]):
    cfg = tiny_config(dpo={"pair_context_limited": pair_context_limited})
    experts = [
        Trajectory(
            traj_id=f"t{i}/expert",
            task_id=f"t{i}",
            reward=1.0,
            messages=(Message("user", f"task t{i}"), Message("assistant", "expert")),
            agent="expert",
        )
        for i in range(len(REASONS))
    ]
    phases: dict[str, list] = {}

    def explore(policy, k, repeat=1):
        agent = "failure" if "failure" in policy else "target"
        return explored[agent], rollouts.summarize(explored[agent])

    def train_pairs(name, start, make_pairs, *, kind, iteration):
        dataset = make_pairs()
        phases[name] = list(dataset.pairs)
        return name, {"dataset": dataset.report.to_dict()}

    return types.SimpleNamespace(
        setup=types.SimpleNamespace(cfg=cfg),
        experts=experts,
        explore=explore,
        explore_pair=lambda first, second, k: (explore(first, k), explore(second, k)),
        pair=lambda first, second: (first(), second()),
        train_pairs=train_pairs,
        base_sft=lambda agent: f"sft_{agent}",
        evaluate=lambda policy: {},
        phases=phases,
    )


def _paired_reasons(pairs) -> set[str]:
    return {
        str(t.extra["terminate_reason"]).split(":")[0]
        for p in pairs
        for t in (p.chosen, p.rejected)
        if t.extra
    }


@pytest.mark.parametrize("pair_context_limited", [False, True])
def test_eto_and_coevolution_pair_context_limited_episodes_only_when_asked(pair_context_limited):
    seed = fresh_seed()
    print("seed", seed)
    explored = _explorations(np.random.default_rng(seed))
    expected = {"done", "max_steps"} | ({"context_limit"} if pair_context_limited else set())
    for method in ("eto", "coevo"):
        stages = _fake_stages(pair_context_limited, explored)
        methods.METHOD_RUNNERS[method](stages, 1, lambda entry: None)
        for name, pairs in stages.phases.items():
            assert _paired_reasons(pairs) == expected, name
    # ETO: the expert against each pairable target episode; D_fail: one pair per pairable task
    assert len(stages.phases["coevo_it1_failure"]) == len(expected)
    eto = _fake_stages(pair_context_limited, explored)
    methods.METHOD_RUNNERS["eto"](eto, 1, lambda entry: None)
    assert len(eto.phases["eto_it1_target"]) == len(expected)


def test_pairable_against_a_direct_filter():
    seed = fresh_seed()
    print("seed", seed)
    rng = np.random.default_rng(seed)
    reasons = rng.choice([*REASONS, "env_error: X"], 30)
    episodes = [_episode(f"t{i}", "target", 0.5, str(r)) for i, r in enumerate(reasons)]
    for flag in (False, True):
        kept = {t.traj_id for t in rollouts.pairable(episodes, context_limited=flag)}
        expected = {
            t.traj_id
            for t, r in zip(episodes, reasons, strict=True)
            if not str(r).startswith("env_error") and (flag or r != "context_limit")
        }
        assert kept == expected
    assert rollouts.pairable(episodes, context_limited=False) == rollouts.usable(episodes)
