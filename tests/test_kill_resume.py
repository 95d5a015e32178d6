"""The kill-and-resume drill end to end: five SIGKILLed and resumed processes against an uninterrupted run."""

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
