"""The `grpo` method in the main job: task draws, groups and advantages, the update loop (beta 0 without a
reference pass), and a tiny end-to-end run on the built-in environment with its own table row, curves,
per-step records and resume (8 fake devices: sharded steps and samplers)."""

import json
import types

import numpy as np
import pytest
from seeds import fresh_seed
from test_experiment import tiny_config
from train_fixtures import single_mesh

from coevo_jax import sharding
from coevo_jax.data.records import Message, TokenTrace, Trajectory
from coevo_jax.experiment import grpo
from coevo_jax.experiment.config import GRPOConfig
from coevo_jax.experiment.run import run
from coevo_jax.experiment.tensorboard import read_scalars
from coevo_jax.reporting.results import load_results


def _episode(task: str, sample: int, reward: float, reason: str = "done") -> Trajectory:
    messages = (Message("user", "u"), Message("assistant", "a"))
    trace = TokenTrace((1, 2, 3, 4, 5), ((2, 4),), (-0.5, -0.25))
    extra = {"terminate_reason": reason}
    return Trajectory(f"{task}/{sample}", task, messages, reward, tokens=trace, extra=extra)


def test_step_tasks_are_seeded_draws_without_replacement():
    tasks = [f"t{i}" for i in range(10)]
    draws = [grpo.step_tasks(tasks, 4, seed=0, step=s) for s in range(3)]
    assert all(len(set(d)) == 4 and d == sorted(d, key=tasks.index) for d in draws)
    assert draws[0] == grpo.step_tasks(tasks, 4, seed=0, step=0) and draws[0] != draws[1]
    assert grpo.step_tasks(tasks, 32, seed=0, step=0) == tasks  # at most every task once


@pytest.mark.parametrize("drop", [False, True])
def test_groups_get_relative_advantages_and_equal_groups_are_counted(drop):
    episodes = [_episode("a", s, r) for s, r in enumerate((1.0, 0.0, 0.0, 1.0))]
    episodes += [_episode("b", s, 0.0) for s in range(4)]  # all equal: no signal
    episodes += [_episode("c", 0, 1.0), _episode("c", 1, 0.0, "env_error: X"), _episode("c", 2, 0.5)]
    examples, stats = grpo.grpo_examples(episodes, GRPOConfig(drop_equal_groups=drop), max_length=64)
    assert stats.groups == 3 and stats.equal_reward_groups == 1 and stats.equal_reward_fraction == 1 / 3
    assert stats.unusable_episodes == 1 and stats.dropped_groups == int(drop)
    advantages = [e.advantage for e in examples]
    a = 0.5 / np.std([1.0, 0.0, 0.0, 1.0], ddof=1)
    expected = [a, -a, -a, a] + ([] if drop else [0.0] * 4) + [np.sqrt(0.5), -np.sqrt(0.5)]
    np.testing.assert_allclose(advantages, expected, rtol=1e-5)
    assert stats.trained_episodes == len(examples) == (6 if drop else 10)


def _multi_step(task: str, sample: int, scores: list[float], states: list[str]) -> Trajectory:
    """An episode of one reply per step: reply k is token 2 + 2k (its span (2 + 2k, 3 + 2k))."""
    replies = len(scores)
    ids = tuple(range(1, 3 + 2 * replies))
    spans = tuple((2 + 2 * k, 3 + 2 * k) for k in range(replies))
    trace = TokenTrace(ids, spans, (-0.5,) * replies)
    extra = {"terminate_reason": "done", "step_scores": scores, "step_states": states}
    turns = [m for _ in range(replies) for m in (Message("assistant", "a"), Message("user", "o"))]
    messages = (Message("user", "u"), *turns[:-1])
    return Trajectory(f"{task}/{sample}", task, messages, scores[-1], tokens=trace, extra=extra)


def ref_gigpo(episodes, gamma, omega):
    """GiGPO written out in float64: episode advantage + omega x the step's discounted return against its
    (task, state) group (ddof=1, singletons 0)."""
    returns = {}
    for e in episodes:
        rewards = np.diff([0.0, *e.extra["step_scores"]])
        after = 0.0
        for k in reversed(range(len(rewards))):
            after = rewards[k] + gamma * after
            returns[(e.traj_id, k)] = after
    groups = {}
    for e in episodes:
        for k, state in enumerate(e.extra["step_states"]):
            groups.setdefault((e.task_id, state), []).append(returns[(e.traj_id, k)])
    by_task = {}
    for e in episodes:
        by_task.setdefault(e.task_id, []).append(e.reward)
    out = []
    for e in episodes:
        rewards = np.asarray(by_task[e.task_id])
        episode = (e.reward - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
        per_reply = []
        for k, state in enumerate(e.extra["step_states"]):
            values = np.asarray(groups[(e.task_id, state)])
            step = (
                0.0
                if len(values) < 2
                else (returns[(e.traj_id, k)] - values.mean()) / (values.std(ddof=1) + 1e-6)
            )
            per_reply.append(episode + omega * step)
        out.append(per_reply)
    return out


def test_gigpo_gives_each_reply_its_episode_and_step_advantage():
    rng = np.random.default_rng(fresh_seed())
    episodes = []
    for task in ("a", "b"):
        for sample in range(4):
            steps = int(rng.integers(1, 6))
            scores = np.maximum.accumulate(rng.choice([0.0, 0.25, 0.5, 1.0], size=steps)).tolist()
            states = [f"s{int(rng.integers(0, 3))}" for _ in range(steps)]  # shared states across episodes
            episodes.append(_multi_step(task, sample, scores, states))
    cfg = GRPOConfig(advantage="gigpo", gamma=0.9, step_weight=0.7)
    examples, stats = grpo.grpo_examples(episodes, cfg, max_length=64)
    expected = ref_gigpo(episodes, 0.9, 0.7)
    for example, e, per_reply in zip(examples, episodes, expected, strict=True):
        at_replies = example.token_advantages()[[start for start, _ in e.tokens.reply_spans]]
        np.testing.assert_allclose(at_replies, per_reply, rtol=1e-4, atol=1e-5)
    assert stats.signal_episodes == sum(np.any(np.abs(r) > 1e-6) for r in expected)
    # "episode": one advantage per episode, the same rows otherwise
    plain, _ = grpo.grpo_examples(episodes, GRPOConfig(), max_length=64)
    assert all(np.ndim(e.advantage) == 0 for e in plain)


def test_gigpo_gives_a_dead_group_signal_where_grpo_has_none():
    """Four episodes with equal rewards (GRPO's advantage 0): from the shared first state one reached half
    the sub-goals a step sooner, so its discounted return there is higher: its step advantage is positive,
    the others' negative."""
    episodes = [_multi_step("t", k, [0.0, 0.5], ["start", f"after{k}"]) for k in range(3)]
    episodes.append(_multi_step("t", 3, [0.5, 0.5], ["start", "after3"]))
    grpo_rows, grpo_stats = grpo.grpo_examples(episodes, GRPOConfig(), max_length=64)
    assert grpo_stats.signal_episodes == 0
    gigpo_rows, gigpo_stats = grpo.grpo_examples(episodes, GRPOConfig(advantage="gigpo"), max_length=64)
    first = [row.token_advantages()[2] for row in gigpo_rows]
    assert first[3] > 0 and all(a < 0 for a in first[:3]) and gigpo_stats.signal_episodes == 4


def test_gigpo_refuses_episodes_without_step_records():
    with pytest.raises(ValueError, match="a/0: no per-step scores"):
        grpo.grpo_examples([_episode("a", 0, 1.0), _episode("a", 1, 0.0)], GRPOConfig(advantage="gigpo"), 64)
    with pytest.raises(ValueError, match="grpo.advantage 'reply'"):
        GRPOConfig(advantage="reply")


def test_updates_with_beta_zero_never_run_the_reference_pass():
    """mu updates per batch, and no reference pass at all with beta = 0 (the issue's contract)."""
    calls = []

    class Steps:
        def step(self, kind):
            def update(state, batch, scalars, frozen):
                calls.append(("update", sorted(batch)))
                return state + 1, {"loss": 0.0, "ratio": 1.0, "abs_log_ratio": 0.0}

            return update

        def grpo_reference(self, params, batch):
            raise AssertionError("reference pass with beta = 0")

    cfg = tiny_config(grpo={"beta": 0.0, "updates_per_batch": 3, "batch_size": 2})
    setup = types.SimpleNamespace(
        cfg=cfg,
        tokenizer=types.SimpleNamespace(pad_token_id=0),
        model_cfg=types.SimpleNamespace(right_padded=True),  # the main job's: each batch is checked
        mesh=single_mesh(),
        rules=sharding.ShardingRules(),
    )
    examples, _ = grpo.grpo_examples([_episode("a", s, float(s % 2)) for s in range(4)], cfg.grpo, 64)
    state, first, last, updates = grpo._train_on(setup, Steps(), 0, {}, None, examples, seed=0)
    assert updates == state == 6 and first["ratio"] == 1.0  # 2 batches of 2 episodes, 3 updates each
    assert all("ref_logps" not in keys for _, keys in calls)


def _grpo_config():
    """Two iterations of one GRPO step each (the optimizer state crosses an iteration), 2 tasks x 4 samples
    per step: one batch of 8 episodes; short episodes and a 1,000-token cache (an episode holds at most one
    token more): one training bucket (1,024), so one update per step."""
    env_kwargs = {"seed": 0, "num_train": 8, "num_test_seen": 4, "num_test_unseen": 4}
    return tiny_config(
        methods=("grpo",),
        iterations=2,
        env={"kwargs": {**env_kwargs, "budget_per_expert_step": 1, "budget_extra_steps": 1}, "eval_tasks": 2},
        grpo={"tasks_per_step": 2, "steps_per_iteration": 1, "batch_size": 8},
        rollout={"cache_len": 1000},
    )


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("grpo_run")
    return run(_grpo_config(), str(workdir)), workdir


@pytest.mark.slow  # a few minutes on a busy 2-core CPU, compilation mostly
def test_grpo_runs_after_sft_with_its_own_row_curves_and_records(grpo_run):
    results, workdir = grpo_run
    method = results["methods"]["GRPO"]
    assert [e["iteration"] for e in method["iterations"]] == [0, 1, 2]
    for entry in method["iterations"]:
        assert all(entry["eval"][split]["episodes"] == 2 for split in ("test_seen", "test_unseen"))
    for entry in method["iterations"][1:]:
        train = entry["train"]["target"]
        assert train["steps"] == 1 and train["episodes"] == 8 and train["updates"] == 1
        assert 0.0 <= train["equal_reward_fraction"] <= 1.0 and np.isfinite(train["final_loss"])
    stages = json.loads((workdir / "stages.json").read_text())
    history = stages["train/grpo_it1_target"]["history"] + stages["train/grpo_it2_target"]["history"]
    assert [h["step"] for h in history] == [1, 2]
    assert json.loads((workdir / "grpo" / "history.json").read_text()) == history
    for record in history:  # float32 sampler and trainer: each step's first update has ratio 1
        assert record["episodes"] == 8 and 1 <= record["groups"] <= 2 and record["updates"] == 1
        assert record["first_abs_log_ratio"] < 1e-5 and record["first_ratio"] == pytest.approx(1.0, abs=1e-5)
    for step in (1, 2):  # every step's episodes, with their sampled tokens
        lines = (workdir / "rollouts" / f"grpo_step{step}_explore.jsonl").read_text().splitlines()
        assert len(lines) == 8
        assert all(json.loads(line)["sampling"]["temperature"] == 0.9 for line in lines)
        assert sum("tokens" in json.loads(line) for line in lines) >= 1
    assert "| GRPO |" in (workdir / "table.md").read_text()
    assert (workdir / "reward_curves.png").stat().st_size > 0
    assert (workdir / "grpo_steps.png").stat().st_size > 0
    steps = [entry["train"]["target"]["step_rewards"] for entry in method["iterations"][1:]]
    assert steps == [[h["reward"] for h in history[:1]], [h["reward"] for h in history[1:]]]
    assert load_results(workdir / "results.json")["methods"].keys() == {"GRPO"}
    scalars = read_scalars(workdir / "tensorboard")
    assert [step for step, _ in scalars["train/grpo_it2_target/reward"]] == [2]
    assert [step for step, _ in scalars["eval/grpo/test_seen/avg_reward"]] == [0, 1, 2]
    assert run(_grpo_config(), str(workdir))["methods"] == results["methods"]  # a rerun does nothing new


class SimulatedKill(Exception):
    pass


@pytest.mark.slow  # a second tiny run, killed in its second GRPO step
def test_a_grpo_run_killed_midway_resumes_to_the_same_records(grpo_run, tmp_path, monkeypatch):
    results, workdir = grpo_run
    train_on, calls = grpo._train_on, {"n": 0}

    def killed_in_the_second_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # after step 1's checkpoint, before step 2's updates
            raise SimulatedKill
        return train_on(*args, **kwargs)

    monkeypatch.setattr(grpo, "_train_on", killed_in_the_second_step)
    with pytest.raises(SimulatedKill):
        run(_grpo_config(), str(tmp_path))
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert "train/grpo_it1_target" in stages and "train/grpo_it2_target" not in stages
    monkeypatch.undo()
    resumed = run(_grpo_config(), str(tmp_path))
    assert resumed["methods"] == results["methods"]
    expected = json.loads((workdir / "grpo" / "history.json").read_text())
    assert json.loads((tmp_path / "grpo" / "history.json").read_text()) == expected


def test_dropping_signal_less_groups_keeps_a_dead_group_gigpo_gives_signal():
    """`drop_equal_groups` drops the groups without any advantage: with GiGPO, an equal-reward group whose
    episodes reached a sub-goal at different steps is kept."""
    timing = [_multi_step("t", k, [0.0, 0.5], ["start", f"after{k}"]) for k in range(3)]
    timing.append(_multi_step("t", 3, [0.5, 0.5], ["start", "after3"]))
    flat = [_multi_step("f", k, [0.0, 0.0], ["start", f"f{k}"]) for k in range(4)]
    for advantage, kept in (("episode", 0), ("gigpo", 4)):
        cfg = GRPOConfig(advantage=advantage, drop_equal_groups=True)
        examples, stats = grpo.grpo_examples(timing + flat, cfg, max_length=64)
        assert stats.equal_reward_groups == 2 and stats.dropped_groups == 2 - kept // 4
        assert len(examples) == kept
