"""The suite's rerun rule (pyproject's addopts): under `-n 2`, a test whose worker process dies runs once more;
a test that fails is not rerun, and one that kills its worker every time still fails."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"

TESTS = """
import os, pathlib, signal

def test_kills_its_worker_once():
    marker = pathlib.Path(os.environ["MARKER"])
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)

def test_kills_its_worker_every_time():
    os.kill(os.getpid(), signal.SIGKILL)

def test_fails():
    assert 1 == 2
"""


def test_only_a_dead_worker_is_rerun(tmp_path):
    (tmp_path / "test_cases.py").write_text(TESTS)
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(PYPROJECT), "--rootdir", str(tmp_path)]
        + ["-p", "no:cacheprovider", "-q", "-n", "2", str(tmp_path / "test_cases.py")],
        cwd=tmp_path,
        env={**os.environ, "MARKER": str(tmp_path / "killed_once")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = completed.stdout.strip().splitlines()[-1]
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "2 failed, 1 passed, 2 rerun" in summary, completed.stdout
    assert "FAILED test_cases.py::test_fails - assert 1 == 2" in completed.stdout
    assert "FAILED test_cases.py::test_kills_its_worker_every_time" in completed.stdout
