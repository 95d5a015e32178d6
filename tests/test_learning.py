"""The learning path, end to end: the quickstart's SFT (its policy and experts, seed 0, 4 of its 10 epochs to
keep CI short) must solve train tasks that a policy which learned nothing cannot.

A regression anywhere between the experts and the greedy rollout (tokenization, loss mask, optimizer, the
sampler, the ReAct loop) shows up here as zero successes, which no unit test would notice.
"""

import json
import os
import subprocess
import sys

import pytest

REDUCED = [
    "--config.methods=('sft',)",
    "--config.show_progress=False",
    "--config.env.eval_splits=('train',)",
    "--config.env.eval_tasks=28",
    "--config.sft.epochs=4",  # 752 updates: enough to pass here (the quickstart trains 10 for dev_unseen)
]


@pytest.mark.slow
def test_quickstart_sft_solves_train_tasks(tmp_path):
    # A shorter SFT (700 experts, 3 epochs) scored 0 of 28 here: the policy learns to copy the rooms named
    # in the task text only late in the quickstart's 752 updates.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as users run it
    env["JAX_PLATFORMS"] = "cpu"
    command = [
        sys.executable,
        "-m",
        "coevo_jax.main",
        "--config=configs/quickstart.py",
        f"--workdir={tmp_path / 'run'}",
        *REDUCED,
    ]
    subprocess.run(command, check=True, env=env, timeout=900, capture_output=True)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    train = results["methods"]["SFT"]["iterations"][0]["eval"]["train"]
    assert train["episodes"] == 28
    # A policy that learned nothing does not even produce the ReAct format, so it scores 0.
    assert train["success_rate"] > 0.0, train
    assert train["avg_reward"] > 0.3, train
