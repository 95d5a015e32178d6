"""`python -m coevo_jax.main` as users run it: a killed run, rerun with the same command, finishes without
redoing finished stages, and prints the Table-1 comparison."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from coevo_jax.data.records import read_trajectories

# configs/tiny.py with the quickstart's recipe (its learning rates, token shift, step budget, DPO updates per
# phase and pair cap, logging cadence and env workers) and one DPO epoch.
OVERRIDES = [
    "--config.log_every_steps=10",
    "--config.env.kwargs.budget_per_expert_step=1",
    "--config.model.token_shift=4",
    "--config.sft.learning_rate=6e-3",
    "--config.dpo.epochs=1",
    "--config.dpo.learning_rates=(3e-5,)",
    "--config.dpo.max_pairs_per_task=3",
    "--config.dpo.updates_per_phase=20",
    "--config.rollout.env_workers=4",
]


def _command(workdir) -> list[str]:
    return [
        sys.executable,
        "-m",
        "coevo_jax.main",
        "--config=configs/tiny.py",
        f"--workdir={workdir}",
        *OVERRIDES,
    ]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as users run it
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _stages(workdir) -> dict:
    path = workdir / "stages.json"  # written atomically: every poll parses a whole file
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.slow
def test_killed_run_resumes_without_redoing_finished_stages(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workdir = tmp_path / "run"
    first = subprocess.Popen(
        _command(workdir), cwd=repo, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 600
    while "eval/sft_target/test_unseen" not in _stages(workdir):
        assert first.poll() is None, first.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the first run made no progress"
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = _stages(workdir)
    sft_policy = workdir / "policies" / "sft_target"
    sft_mtime = sft_policy.stat().st_mtime_ns

    second = subprocess.run(
        _command(workdir), cwd=repo, env=_env(), capture_output=True, text=True, timeout=900
    )
    assert second.returncode == 0, second.stderr[-3000:]
    after = _stages(workdir)
    assert {k: after[k] for k in before} == before  # finished stages kept, not recomputed
    assert sft_policy.stat().st_mtime_ns == sft_mtime
    assert {"train/eto_it1_target", "train/coevo_it1_target", "train/coevo_it1_failure"} <= after.keys()
    for path in (workdir / "rollouts").glob("*.jsonl"):  # resumed rollouts append, never duplicate
        ids = [t.traj_id for t in read_trajectories(str(path))]
        assert len(ids) == len(set(ids)), path
    results = json.loads((workdir / "results.json").read_text())
    assert list(results["methods"]) == ["SFT", "ETO", "CoEvolving"]
    assert "| CoEvolving |" in second.stdout
    for name in ("table.md", "reward_curves.png", "failure_analysis.png"):
        assert (workdir / name).stat().st_size > 0
