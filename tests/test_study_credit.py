"""The credit variants' table against direct counts on synthetic runs, and its paired contrasts."""

import dataclasses
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from seeds import fresh_seed
from test_data_export import episode

from coevo_jax.data.records import write_trajectories
from coevo_jax.envs.base import GRADED_SCORE
from coevo_jax.experiment.config import EnvConfig, ExperimentConfig, GRPOConfig
from studies.credit import grpo_credit

SPLITS = ["test_seen", "test_unseen"]
VARIANTS = {"episode": ("episode", "none"), "pairs": ("episode", "pairs")}


def _evals(rng):
    out = {}
    for split in SPLITS:
        rewards = {f"{split}/{t}": float(rng.choice([0.0, 0.5, 1.0])) for t in range(10)}
        values = list(rewards.values())
        out[split] = {
            "avg_reward": float(np.mean(values)),
            "success_rate": float(np.mean([v == 1.0 for v in values])),
            "task_rewards": rewards,
        }
    return out


def _paired_episodes(group, max_pairs):
    """Distinct episodes in the `max_pairs` largest-margin pairs of different graded scores (ties by ids)."""
    score = lambda e: e.extra["metrics"][GRADED_SCORE]  # noqa: E731
    pairs = [(a, b) for a, b in itertools.combinations(group, 2) if score(a) != score(b)]
    pairs.sort(key=lambda p: -abs(score(p[0]) - score(p[1])))
    taken = pairs[:max_pairs]
    # which of the pairs tied at the cut-off margin are kept depends on the ids: count only when no tie is cut
    cut = abs(score(taken[-1][0]) - score(taken[-1][1])) if taken else None
    if len(pairs) > max_pairs and cut == abs(score(pairs[max_pairs][0]) - score(pairs[max_pairs][1])):
        return None
    return len({e.traj_id for p in taken for e in p})


def _run(root, rng, variant, seed, steps=3, k=4):
    """A finished credit run: K episodes of 3 tasks a step, rewards drawn from {0, 0.5, 1}."""
    workdir = root / f"{variant}_{seed}"
    (workdir / "grpo").mkdir(parents=True)
    (workdir / "rollouts").mkdir()
    advantage, dead = VARIANTS[variant]
    config = ExperimentConfig(
        seed=seed,
        methods=("sft", "grpo"),
        env=EnvConfig(eval_splits=tuple(SPLITS)),
        grpo=GRPOConfig(advantage=advantage, dead_groups=dead, samples_per_task=k),
    )
    (workdir / "config.json").write_text(json.dumps(config.to_json()))
    (workdir / "stages.json").write_text("{}")
    history, expected = [], {"dead": [], "pairs_episodes": []}
    for step in range(1, steps + 1):
        episodes = []
        for task in ("t0", "t1", "t2"):
            rewards = rng.choice([0.0, 0.5, 1.0], size=k)
            if task == "t0":  # a dead group: all failed with one reward
                rewards[:] = 0.5
            for s, reward in enumerate(rewards):
                made = episode(f"s{step}_{task}_{s}", task, float(reward), "target", 1)
                if task == "t0":  # the environment's graded score ranks the dead group's failures
                    score = float(rng.choice([0.1, 0.2, 0.3, 0.4]))
                    made = dataclasses.replace(made, extra={**made.extra, "metrics": {GRADED_SCORE: score}})
                episodes.append(made)
        write_trajectories(workdir / "rollouts" / f"grpo_step{step}_explore.jsonl", episodes)
        signal = sum(len({e.reward for e in episodes if e.task_id == t}) > 1 for t in ("t0", "t1", "t2")) * k
        history.append(
            {"step": step, "episodes": 3 * k, "signal_episodes": signal, "reward": float(rng.uniform())}
        )
        dead = sum(
            len({e.reward for e in episodes if e.task_id == t}) == 1
            and all(e.reward < 1 for e in episodes if e.task_id == t)
            for t in ("t0", "t1", "t2")
        )
        expected["dead"].append(dead)
        expected["pairs_episodes"].append(_paired_episodes([e for e in episodes if e.task_id == "t0"], 4))
    (workdir / "grpo" / "history.json").write_text(json.dumps(history))
    results = {
        "splits": SPLITS,
        "methods": {
            "SFT": {"iterations": [{"iteration": 0, "eval": _evals(rng)}]},
            "GRPO": {
                "iterations": [{"iteration": 1, "eval": _evals(rng)}, {"iteration": 2, "eval": _evals(rng)}]
            },
        },
    }
    (workdir / "results.json").write_text(json.dumps(results))
    return workdir, history, results, expected


def test_the_summary_counts_what_each_step_did(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    workdir, history, results, expected = _run(tmp_path, rng, "pairs", 3)
    summary = grpo_credit.run_summary(str(workdir))
    assert (summary["variant"], summary["seed"], summary["iteration"]) == ("pairs", 3, 2), seed
    assert [s["signal"] for s in summary["steps"]] == [h["signal_episodes"] for h in history]
    assert [s["dead_groups"] for s in summary["steps"]] == expected["dead"], seed
    for step, count in zip(summary["steps"], expected["pairs_episodes"], strict=True):
        if count is not None:  # (a tie at the cut-off: the job's id order decides, not checked here)
            assert step["dead_pair_episodes"] == count, seed
        assert 0 < step["dead_pairs"] <= 4, seed
    assert summary["eval"] == results["methods"]["GRPO"]["iterations"][1]["eval"]


def test_the_paired_table_subtracts_the_same_seed(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    runs = [grpo_credit.run_summary(str(_run(tmp_path, rng, v, s)[0])) for v in VARIANTS for s in (0, 1)]
    table = grpo_credit.paired_table(runs, "episode")
    by = {(r["variant"], r["seed"]): r for r in runs}
    for split in SPLITS:
        deltas = [
            100
            * (by["pairs", s]["eval"][split]["avg_reward"] - by["episode", s]["eval"][split]["avg_reward"])
            for s in (0, 1)
        ]
        row = next(line for line in table.splitlines() if f"| pairs − episode | {split} |" in line)
        assert ", ".join(f"{d:+.1f}" for d in deltas) in row, (seed, row)
        assert f"{np.mean(deltas):+.1f} [" in row, (seed, row)
    assert "| episode | 0, 1 |" in grpo_credit.variant_table(runs)
    with pytest.raises(ValueError, match="baseline variant 'gigpo'"):
        grpo_credit.paired_table(runs, "gigpo")


def test_the_command_refuses_a_directory_that_is_no_run(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "studies.credit.grpo_credit", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and str(tmp_path) in done.stderr


def _sampled(rng):
    return {
        split: {
            "reward": float(rng.uniform()),
            "success_rate": float(rng.uniform()),
            "difference": float(rng.uniform(-0.2, 0.2)),
        }
        for split in SPLITS
    }


def test_the_sampled_table_reads_each_runs_sampled_evaluation(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    workdirs = [_run(tmp_path, rng, "episode", s)[0] for s in (0, 1)]
    written = []
    for workdir in workdirs:  # as analysis.sampled_eval writes it, the last GRPO policy beside the SFT policy
        policies = {"sft_target": _sampled(rng), "grpo_it2_target": _sampled(rng)}
        (workdir / "sampled_eval").mkdir()
        summary = {"baseline": "sft_target", "samples": 4, "temperature": 0.9, "policies": policies}
        (workdir / "sampled_eval" / "sampled_eval.json").write_text(json.dumps(summary))
        written.append(policies)
    other = _run(tmp_path, rng, "pairs", 0)[0]  # no sampled evaluation: left out of the table
    runs = [grpo_credit.run_summary(str(w)) for w in [*workdirs, other]]
    table = grpo_credit.sampled_table(runs)
    row = next(line for line in table.splitlines() if line.startswith("| episode |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["episode", "0, 1", "4 × 0.9"], (seed, row)
    for index, split in enumerate(SPLITS):
        rewards = [100 * p["grpo_it2_target"][split]["reward"] for p in written]
        sft = [100 * p["sft_target"][split]["reward"] for p in written]
        deltas = [100 * p["grpo_it2_target"][split]["difference"] for p in written]
        assert cells[3 + index].startswith(f"{np.mean(rewards):.1f} ± {np.std(rewards, ddof=1):.1f} /"), seed
        assert cells[3 + index].endswith(f"({np.mean(sft):.1f} ± {np.std(sft, ddof=1):.1f})"), seed
        assert cells[3 + len(SPLITS) + index] == f"{np.mean(deltas):.1f} ± {np.std(deltas, ddof=1):.1f}", seed
    assert "| pairs |" not in table
    assert grpo_credit.sampled_table(runs[2:]) == ""


def test_the_paired_table_pairs_sampled_evaluations_by_seed(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    written = {}
    for variant in VARIANTS:
        for s in (0, 1):
            workdir = _run(tmp_path, rng, variant, s)[0]
            policies = {"sft_target": _sampled(rng), "grpo_it2_target": _sampled(rng)}
            (workdir / "sampled_eval").mkdir()
            summary = {"baseline": "sft_target", "samples": 2, "temperature": 1.0, "policies": policies}
            (workdir / "sampled_eval" / "sampled_eval.json").write_text(json.dumps(summary))
            written[variant, s] = policies["grpo_it2_target"]
    runs = [grpo_credit.run_summary(str(tmp_path / f"{v}_{s}")) for v in VARIANTS for s in (0, 1)]
    table = grpo_credit.paired_table(runs, "episode")
    for split in SPLITS:
        deltas = [
            100 * (written["pairs", s][split]["reward"] - written["episode", s][split]["reward"])
            for s in (0, 1)
        ]
        row = next(line for line in table.splitlines() if f"| pairs − episode | {split} |" in line)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[5] == ", ".join(f"{d:+.1f}" for d in deltas), (seed, row)
        assert cells[6].startswith(f"{np.mean(deltas):+.1f} ["), (seed, row)
