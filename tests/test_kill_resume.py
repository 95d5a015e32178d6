"""The kill-and-resume drill end to end: five SIGKILLed and resumed processes against an uninterrupted run
(same policies, trajectories and results; no finished stage redone, no episode written twice)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_killed_and_resumed_run_equals_the_uninterrupted_one(tmp_path):
    # the drill sets its processes' device count itself, whatever XLA_FLAGS this test process has
    result = subprocess.run(
        [
            sys.executable,
            os.path.join("launch", "kill_resume_drill.py"),
            "--workdir",
            str(tmp_path / "drill"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| point |")
    ]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == ["sft", "save", "eval", "explore", "dpo"]
    assert all(row.endswith("| yes | yes |") for row in rows), result.stdout
    assert "policies identical: 5/5" in result.stdout
    assert "finished stages redone by a resume: 0" in result.stdout
    assert "episodes written twice: 0" in result.stdout
    killed = tmp_path / "drill" / "killed"  # the last resume wrote the reports
    assert "| CoEvolving |" in (killed / "table.md").read_text()
    for name in ("reward_curves.png", "failure_analysis.png"):
        assert (killed / name).stat().st_size > 0


def load_drill():
    """launch/kill_resume_drill.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "kill_resume_drill", os.path.join(REPO, "launch", "kill_resume_drill.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its own module up
    spec.loader.exec_module(module)
    return module


def _file(ids, logprobs):
    return {
        "t0": {"id": "t0", "reward": 0.5, "tokens": {"ids": ids, "spans": [[1, 3]], "logprobs": logprobs}}
    }


def test_trajectory_files_compare_token_ids_exactly_and_sampler_logprobs_to_the_last_bits():
    drill = load_drill()
    base = _file([1, 2, 3], [-5.283123970031738, -0.5])
    assert drill.same_trajectories(base, _file([1, 2, 3], [-5.28312349319458, -0.5]))  # one float32 ulp
    assert not drill.same_trajectories(base, _file([1, 2, 3], [-5.2831, -0.5]))
    assert not drill.same_trajectories(base, _file([1, 2, 4], [-5.283123970031738, -0.5]))
    assert not drill.same_trajectories(base, _file([1, 2, 3], [-5.283123970031738]))
    other_reward = _file([1, 2, 3], [-5.283123970031738, -0.5])
    other_reward["t0"]["reward"] = 0.6
    assert not drill.same_trajectories(base, other_reward)
    assert not drill.same_trajectories(base, {})
    assert not drill.same_trajectories(base, None)


def test_duplicated_episodes_are_found(tmp_path):
    (tmp_path / "rollouts").mkdir()
    lines = [{"id": "a"}, {"id": "b"}, {"id": "a"}]
    (tmp_path / "rollouts" / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "rollouts" / "y.jsonl").write_text(json.dumps({"id": "a"}) + "\n")
    assert load_drill().duplicated_episodes(str(tmp_path)) == ["x.jsonl: a"]
