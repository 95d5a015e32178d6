"""The learning path, end to end: a short SFT of the quickstart's policy on the built-in environment's
experts must solve some train tasks that the untrained policy cannot.

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
    "--config.env.kwargs.num_train=700",
    "--config.env.eval_splits=('train',)",
    "--config.env.eval_tasks=28",
    "--config.sft.epochs=3",
]


@pytest.mark.slow
def test_short_sft_solves_train_tasks(tmp_path):
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
    assert train["avg_reward"] > 0.2, train
