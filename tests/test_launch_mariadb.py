"""launch/mariadb.sh: a server of its own under the cache directory, the databases loaded once, stop and status.

Runs the script on a second, throwaway cache directory (its own data directory and socket), beside any
server the other tests use. Needs Debian's mariadb-server (the script installs it; CI has it): without
`mariadbd` the test skips, except under CI.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from coevo_jax.envs.intercode_sql.server import READER, MariaDbBackend

SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "mariadb.sh"


def _script(command: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COEVO_JAX_CACHE": str(cache)}
    return subprocess.run(
        ["bash", str(SCRIPT), command], capture_output=True, text=True, env=env, timeout=300
    )


def test_start_loads_once_and_stop_stops():
    if shutil.which("mariadbd") is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs mariadb-server (launch/mariadb.sh start), yet mariadbd is missing")
        pytest.skip("mariadbd is not installed (bash launch/mariadb.sh start installs it)")
    cache = Path(tempfile.mkdtemp(prefix="coevo_mdb_"))  # short: a unix socket path has ~100 characters
    try:
        assert _script("status", cache).returncode == 3
        first = _script("start", cache)
        assert first.returncode == 0, first.stderr
        assert "initialising" in first.stdout and "loading the 20 Spider databases" in first.stdout
        socket = cache / "mariadb" / "mysqld.sock"
        backend = MariaDbBackend(socket, user=READER, timeout_s=5.0, max_rows=100, max_result_bytes=100_000)
        databases = backend.answer("pets_1", "SHOW DATABASES")
        assert len(databases) == 21 and ("information_schema",) in databases  # the Spider 20 and no other
        assert backend.answer("pets_1", "SELECT count(*) FROM pets") == [(3,)]
        again = _script("start", cache)
        assert again.returncode == 0 and "already running" in again.stdout and "loading" not in again.stdout
        assert "running" in _script("status", cache).stdout
        assert _script("stop", cache).returncode == 0 and _script("status", cache).returncode == 3
        restarted = _script("start", cache)  # a restart finds its databases loaded
        assert (
            restarted.returncode == 0 and "started" in restarted.stdout and "loading" not in restarted.stdout
        )
        assert backend.answer("pets_1", "SELECT count(*) FROM pets") == [(3,)]  # the session reconnects
        backend.close()
    finally:
        _script("stop", cache)
        shutil.rmtree(cache, ignore_errors=True)
