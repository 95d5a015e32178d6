"""The method runners' wiring on hand-built episodes: which policy explores, which phase trains on which
pairs, and what each iteration records, with `Stages` replaced by a recorder (no model, no environment)."""

import dataclasses
import re
import types
from pathlib import Path

import pytest

from coevo_jax.data.pair_pool import EXPERT_VS_FAILURE, EXPERT_VS_TARGET, FAILURE_VS_FAILURE
from coevo_jax.data.records import Message, Trajectory
from coevo_jax.experiment.config import METHODS, ExperimentConfig, RolloutSpec
from coevo_jax.experiment.methods import METHOD_RUNNERS
from coevo_jax.train import StepKind

# each agent's reward on each task, whatever its policy and iteration: task A both agents fail, task B only
# the failure agent fails, task C only the target fails and the failure agent succeeds
REWARDS = {"target": {"A": 0.5, "B": 1.0, "C": 0.7}, "failure": {"A": 0.8, "B": 0.3, "C": 1.0}}
TASKS = ("A", "B", "C")


def episode(task: str, traj_id: str, reward: float) -> Trajectory:
    messages = (Message("user", f"Solve task {task}."), Message("assistant", f"Action: {traj_id}"))
    return Trajectory(traj_id, task, messages, reward, traj_id.split("/")[1])


EXPERTS = [episode(task, f"{task}/expert", 1.0) for task in TASKS]


class RecordingStages:
    """What `methods` calls on `Stages`, answered from `REWARDS` and recorded: explorations (policy,
    iteration, repeat) and pair phases (name, start policy, step kind, the pairs built)."""

    def __init__(self, cfg: ExperimentConfig, rewards=None):
        self.setup = types.SimpleNamespace(cfg=cfg)
        self.experts = EXPERTS
        self.rewards = rewards or {}
        self.explored, self.phases = [], []

    def base_sft(self, agent):
        return f"sft_{agent}"

    def explore(self, policy, iteration, *, repeat=1):
        self.explored.append((policy, iteration, repeat))
        agent = policy.rsplit("_", 1)[-1]
        samples = repeat * self.setup.cfg.rollout.samples_per_task
        episodes = []
        for task in TASKS:
            for sample in range(samples):
                reward = self.rewards.get((agent, task, sample), REWARDS[agent][task])
                episodes.append(episode(task, f"{task}/{agent}/{policy}/it{iteration}/s{sample}", reward))
        failures = [t.reward for t in episodes if t.reward < 1.0]
        return episodes, {"episodes": len(episodes), "failures": len(failures)}

    def explore_pair(self, first, second, iteration):
        return self.explore(first, iteration), self.explore(second, iteration)

    def pair(self, first, second):
        return first(), second()

    def evaluate(self, policy):
        return {"test_seen": {"policy": policy}}

    def train_pairs(self, name, start, make_pairs, *, kind, iteration):
        pairs = make_pairs()
        self.phases.append((name, start, kind, pairs))
        return name, {"steps": 1, "dataset": pairs.report.to_dict()}


def kinds(pairs) -> list[tuple[str, str, str, float, float]]:
    return [(p.kind, p.chosen.task_id, p.rejected.agent, p.lambda_dpo, p.lambda_sft) for p in pairs]


def run(method: str, iterations: int = 2, cfg: ExperimentConfig | None = None, rewards=None):
    stages = RecordingStages(cfg or ExperimentConfig(methods=(method,)), rewards)
    history = METHOD_RUNNERS[method](stages, iterations, lambda entry: None)
    return stages, history


def test_expert_pairs_train_the_target_on_both_agents_failures_against_the_expert_only():
    stages, history = run("coevo_expert_pairs")
    names = [(name, start, kind) for name, start, kind, _ in stages.phases]
    assert names == [
        ("coevo_expert_pairs_it1_failure", "sft_failure", StepKind.DPO),
        ("coevo_expert_pairs_it1_target", "sft_target", StepKind.COEVO),
        ("coevo_expert_pairs_it2_failure", "coevo_expert_pairs_it1_failure", StepKind.DPO),
        ("coevo_expert_pairs_it2_target", "coevo_expert_pairs_it1_target", StepKind.COEVO),
    ]
    failure_pairs, target_pairs = stages.phases[0][3], stages.phases[1][3]
    assert kinds(failure_pairs) == [(FAILURE_VS_FAILURE, "A", "target", 1.0, 0.0)]  # eq. 6 on task A only
    assert kinds(target_pairs) == [
        (EXPERT_VS_FAILURE, "A", "failure", 0.5, 0.5),
        (EXPERT_VS_TARGET, "A", "target", 0.5, 0.5),
        (EXPERT_VS_FAILURE, "B", "failure", 0.5, 0.5),
        (EXPERT_VS_TARGET, "C", "target", 0.5, 0.5),
    ]  # no failure-failure pair; C's failure-agent success and B's target success make none
    assert [p.hard_negative for p in target_pairs] == [True, False, False, True]  # 0.8 and 0.7 rejected
    entry = history[1]
    assert set(entry["train"]) == {"target", "failure"} and entry["failed_by_both"] == 1
    assert entry["pairs"]["target"] == {
        "pairs": 4,
        "hard_negatives": 2,
        "by_kind": {EXPERT_VS_FAILURE: 2, EXPERT_VS_TARGET: 2},
    }
    eq8 = run("coevo")[0].phases[1][3]  # the paper's D_tgt also pairs the two agents' failures of task A
    assert sorted(kinds(eq8)) == sorted([*kinds(target_pairs), (FAILURE_VS_FAILURE, "A", "target", 1.0, 0.0)])


def test_frozen_after_iteration_1_trains_the_failure_agent_once_then_explores_with_it():
    stages, history = run("coevo_frozen_after_1", iterations=3)
    trained = [name for name, *_ in stages.phases if name.endswith("_failure")]
    assert trained == ["coevo_frozen_after_1_it1_failure"]
    failure_explorations = [(p, k) for p, k, _ in stages.explored if p.endswith("_failure")]
    assert failure_explorations == [
        ("sft_failure", 1),
        ("coevo_frozen_after_1_it1_failure", 2),
        ("coevo_frozen_after_1_it1_failure", 3),
    ]
    assert [set(entry.get("train", {})) for entry in history] == [
        set(),
        {"target", "failure"},
        {"target"},
        {"target"},
    ]
    assert kinds(stages.phases[0][3]) == [(FAILURE_VS_FAILURE, "A", "target", 1.0, 0.0)]
    # the target keeps eq. 8's pairs, failure-failure ones included
    assert FAILURE_VS_FAILURE in history[3]["pairs"]["target"]["by_kind"]


def test_the_never_trained_ablation_is_unchanged():
    stages, history = run("coevo_frozen", iterations=2)
    assert [name for name, *_ in stages.phases] == ["coevo_frozen_it1_target", "coevo_frozen_it2_target"]
    assert [(p, k) for p, k, _ in stages.explored if p.endswith("_failure")] == [
        ("sft_failure", 1),
        ("sft_failure", 2),
    ]
    assert [entry.get("failed_by_both") for entry in history] == [None, 1, 1]


@pytest.mark.parametrize("samples_per_task,repeat", [(1, 4), (2, 2), (4, 1)])
def test_best_of_4_plays_4_episodes_a_task_and_rejects_the_best_failure(samples_per_task, repeat):
    cfg = ExperimentConfig(methods=("best_of_4",), rollout=RolloutSpec(samples_per_task=samples_per_task))
    # the target's 4 episodes of task A score 0.5, 0.9, 0.2, 1.0 and of B 1.0 each; C stays at 0.7
    rewards = {("target", "A", 1): 0.9, ("target", "A", 2): 0.2, ("target", "A", 3): 1.0}
    stages, history = run("best_of_4", cfg=cfg, rewards=rewards)
    assert stages.explored == [("sft_target", 1, repeat), ("best_of_4_it1_target", 2, repeat)]
    (name, start, kind, pairs), _ = stages.phases
    assert (name, start, kind) == ("best_of_4_it1_target", "sft_target", StepKind.DPO)
    assert [(p.chosen.traj_id, p.rejected.traj_id, p.lambda_dpo, p.lambda_sft) for p in pairs] == [
        ("A/expert", "A/target/sft_target/it1/s1", 1.0, 0.0),  # 0.9: the best of A's three failures
        ("C/expert", "C/target/sft_target/it1/s0", 1.0, 0.0),  # C's 4 samples tie at 0.7: the first
    ]  # B: all 4 succeeded, no pair
    assert history[1]["pairs"]["target"] == {
        "pairs": 2,
        "hard_negatives": 2,
        "by_kind": {EXPERT_VS_TARGET: 2},
    }
    assert history[1]["explore"]["target"]["episodes"] == 12


def test_best_of_4_needs_samples_per_task_that_divide_4():
    for samples in (3, 8, 0):
        with pytest.raises(ValueError, match="best_of_4 samples 4 episodes per task"):
            ExperimentConfig(methods=("best_of_4",), rollout=RolloutSpec(samples_per_task=samples))
    assert ExperimentConfig(methods=("eto",), rollout=RolloutSpec(samples_per_task=3))  # others do not care


def test_match_exploration_leaves_best_of_4_at_4_episodes_a_task():
    cfg = dataclasses.replace(ExperimentConfig(methods=("best_of_4",)), match_exploration=True)
    stages, _ = run("best_of_4", iterations=1, cfg=cfg)
    assert stages.explored == [("sft_target", 1, 4)]


def test_the_readme_methods_table_names_every_method():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("## Methods") : readme.index("## Configs")]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    assert set(METHODS) <= named, sorted(set(METHODS) - named)
