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

TINY = [
    "--config.iterations=1",
    "--config.max_length=2048",
    "--config.length_buckets=(1024,)",
    "--config.checkpoint_every_steps=2",
    "--config.show_progress=False",
    "--config.env.kwargs.num_train=8",
    "--config.env.kwargs.num_test_seen=4",
    "--config.env.kwargs.num_test_unseen=4",
    "--config.env.explore_tasks=8",
    "--config.model.vocab_size=300",
    "--config.model.hidden_size=32",
    "--config.model.intermediate_size=64",
    "--config.model.num_layers=1",
    "--config.model.num_heads=2",
    "--config.model.num_kv_heads=1",
    "--config.model.head_dim=16",
    "--config.sft.epochs=2",
    "--config.dpo.epochs=1",
    "--config.rollout.max_new_tokens=16",
    "--config.rollout.cache_len=2048",
    "--config.rollout.groups=1",
]


def _command(workdir) -> list[str]:
    return [
        sys.executable,
        "-m",
        "coevo_jax.main",
        "--config=configs/quickstart.py",
        f"--workdir={workdir}",
        *TINY,
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
