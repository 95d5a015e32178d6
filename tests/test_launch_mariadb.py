"""launch/mariadb.sh and launch/mysql.sh: a server of its own under the cache directory, the databases loaded
once, stop and status.

Runs each script on a second, throwaway cache directory (its own data directory and socket), beside any
server the other tests use. mariadb.sh needs Debian's mariadb-server (the script installs it; CI has it):
without `mariadbd` its test skips, except under CI. mysql.sh fetches MySQL from Debian's unstable suite into
that directory: its test runs where the suite is reachable, and not in CI (the suite moves).
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from coevo_jax.envs.intercode_sql.server import READER, MariaDbBackend, MySqlBackend

LAUNCH = Path(__file__).resolve().parents[1] / "launch"


def _script(name: str, command: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COEVO_JAX_CACHE": str(cache)}
    env.pop("COEVO_MYSQL_SOURCE", None)
    return subprocess.run(
        ["bash", str(LAUNCH / f"{name}.sh"), command], capture_output=True, text=True, env=env, timeout=600
    )


def _start_loads_once_and_stop_stops(name: str, backend_class) -> None:
    cache = Path(tempfile.mkdtemp(prefix="coevo_db_"))  # short: a unix socket path has ~100 characters
    try:
        assert _script(name, "status", cache).returncode == 3
        first = _script(name, "start", cache)
        if name == "mysql" and "fetching the packages failed" in first.stderr:
            pytest.skip(f"Debian's unstable suite is out of reach: {first.stderr[-300:]}")
        assert first.returncode == 0, first.stderr
        assert "initialising" in first.stdout and "loading the 20 Spider databases" in first.stdout
        socket = cache / name / "mysqld.sock"
        backend = backend_class(socket, user=READER, timeout_s=5.0, max_rows=100, max_result_bytes=100_000)
        databases = backend.answer("pets_1", "SHOW DATABASES")
        system = {("information_schema",)} | ({("performance_schema",)} if name == "mysql" else set())
        assert len(databases) == 20 + len(system) and system <= set(databases)  # the Spider 20 and no other
        assert backend.answer("pets_1", "SELECT count(*) FROM pets") == [(3,)]
        assert backend.answer("pets_1", "DELETE FROM pets").startswith("Error executing query")
        again = _script(name, "start", cache)
        assert again.returncode == 0 and "already running" in again.stdout and "loading" not in again.stdout
        assert "running" in _script(name, "status", cache).stdout
        assert _script(name, "stop", cache).returncode == 0 and _script(name, "status", cache).returncode == 3
        restarted = _script(name, "start", cache)  # a restart finds its databases loaded
        assert (
            restarted.returncode == 0 and "started" in restarted.stdout and "loading" not in restarted.stdout
        )
        assert backend.answer("pets_1", "SELECT count(*) FROM pets") == [(3,)]  # the session reconnects
        backend.close()
    finally:
        _script(name, "stop", cache)
        shutil.rmtree(cache, ignore_errors=True)


def test_mariadb_start_loads_once_and_stop_stops():
    if shutil.which("mariadbd") is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs mariadb-server (launch/mariadb.sh start), yet mariadbd is missing")
        pytest.skip("mariadbd is not installed (bash launch/mariadb.sh start installs it)")
    _start_loads_once_and_stop_stops("mariadb", MariaDbBackend)


@pytest.mark.slow
def test_mysql_start_loads_once_and_stop_stops():
    if os.environ.get("CI"):
        pytest.skip("not in CI: launch/mysql.sh fetches from Debian's moving unstable suite")
    if shutil.which("dpkg-deb") is None:
        pytest.skip("launch/mysql.sh unpacks Debian packages with dpkg-deb")
    _start_loads_once_and_stop_stops("mysql", MySqlBackend)
