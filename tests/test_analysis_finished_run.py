"""The workdir tools of `coevo_jax.analysis`, each run through its entry point on one tiny finished run.

The run (`configs/tiny.py`): SFT on the first 4 of 8 built-in train tasks, ETO's exploration and DPO phase,
and one GRPO step of 2 tasks x 4 episodes, 2 test tasks per split; the train tasks after the experts' are
the tools' held-out tasks.
"""

import json
import pathlib

import numpy as np
import pytest
from test_experiment import tiny_config

from coevo_jax import envs
from coevo_jax.analysis import dev_eval, grpo_logprob_gap, sampled_eval
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.experiment.run import run
from studies.grpo_paired import grpo_paired_baseline
from studies.smollm2 import dpo_lr_probe

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
POLICIES = ["sft_target", "eto_it1_target", "grpo_it1_target"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("finished_run")
    cfg = tiny_config(
        methods=("eto", "grpo"),
        env={"expert_tasks": 4, "explore_tasks": 4, "eval_tasks": 2},
        grpo={"tasks_per_step": 2, "steps_per_iteration": 1, "batch_size": 8},
    )
    run(cfg, str(path))
    return path


@pytest.mark.slow  # a tiny run with every stage the tools read, then five tools: minutes, compilation mostly
def test_each_tool_runs_on_a_finished_run(workdir, tmp_path):
    experts = [t.task_id for t in read_trajectories(workdir / "experts.jsonl")]
    train = envs.make("builtin", **dict(tiny_config().env.kwargs)).tasks("train")
    assert len(experts) == 4 and train[:4] == experts

    dev = dev_eval.main(["--workdir", str(workdir), "--dev", "2", "--policies", *POLICIES])
    assert dev["dev_tasks"] == train[4:6]  # the train tasks after the experts'
    assert list(dev["policies"]) == POLICIES
    assert all(len(result["rewards"]) == 2 for result in dev["policies"].values())
    assert json.loads((workdir / "dev_eval" / "dev_eval.json").read_text()) == dev

    sampled = sampled_eval.main(["--workdir", str(workdir), "--policies", *POLICIES[::2], "--samples", "2"])
    baseline = sampled["policies"]["sft_target"]
    for split in ("test_seen", "test_unseen"):
        assert baseline[split]["tasks"] == 2 and baseline[split]["episodes"] == 4
        assert baseline[split]["difference"] == 0.0 and baseline[split]["tasks_tied"] == 2  # itself
        assert baseline[split]["graded_score"]["difference"] == 0.0  # the built-in grades sub-goal progress
        assert sampled["policies"]["grpo_it1_target"][split]["tasks"] == 2

    paired = grpo_paired_baseline.main(["--workdir", str(workdir), "--out", str(tmp_path)])
    (step,) = paired["steps"]  # step 1 sampled the SFT policy itself, with the same seed: the same episodes
    assert step["difference"] == 0.0 and step["entropy"] == pytest.approx(step["baseline_entropy"], abs=1e-5)
    assert (tmp_path / "grpo_paired.png").stat().st_size > 0

    rows = grpo_logprob_gap.main(["--workdir", str(workdir), "--tasks", "1", "--samples", "2"])
    assert [(r["sample_dtype"], r["compute_dtype"]) for r in rows] == [
        ("float32", "float32"),
        ("float32", "bfloat16"),
        ("bfloat16", "float32"),
        ("bfloat16", "bfloat16"),
    ]
    assert all(r["tokens"] > 0 for r in rows)
    assert rows[0]["mean_abs_gap"] < 1e-4  # float32 on both sides: the first update's ratio is 1
    assert (workdir / "grpo_logprob_gap.json").exists()

    out = tmp_path / "probe.jsonl"
    args = [
        "--config",
        "configs/tiny.py",
        "--run",
        str(workdir),
        "--lrs",
        "1e-3",
        "--dev",
        "2",
        "--out",
        str(out),
    ]
    sft, dpo = dpo_lr_probe.main(args)
    assert [line["learning_rate"] for line in map(json.loads, out.read_text().splitlines())] == [0.0, 1e-3]
    assert sft["updates"] == 0 and dpo["updates"] > 0 and dpo["pairs"] > 0
    assert sft["dev"]["episodes"] == dpo["dev"]["episodes"] == 2
    assert np.isfinite(dpo["final_reward_margin"])
