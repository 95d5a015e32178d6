"""InterCode-SQL's backends for parametrized tests: the server backend needs `bash launch/mariadb.sh start`.

Without a server a test of the mariadb backend is skipped, except where $CI is set: CI starts the server
(.ci/run), so there a missing server fails the test instead of hiding it.
"""

import os

import pytest

from coevo_jax.envs.intercode_sql.env import BACKENDS

__all__ = ["BACKENDS", "require_backend", "table_checksums"]


def require_backend(backend: str) -> None:
    """Skips (fails under $CI) a mariadb-backend test when no server answers at the default socket."""
    if backend != "mariadb":
        return
    from coevo_jax.envs.intercode_sql.server import MariaDbBackend, ServerUnavailable

    try:
        MariaDbBackend(timeout_s=1.0, max_rows=10, max_result_bytes=1000).close()
    except ServerUnavailable as error:
        if os.environ.get("CI"):
            pytest.fail(f"CI starts the MariaDB server (launch/mariadb.sh start), yet: {error}")
        pytest.skip(f"no MariaDB server (bash launch/mariadb.sh start): {error}")


def table_checksums(env, databases) -> dict:
    """CHECKSUM TABLE of every table of `databases`, read through the environment's server sessions."""
    sums = {}
    for db in databases:
        tables = [name for (name,) in env.run(db, "SHOW TABLES")]
        rows = env.run(db, "CHECKSUM TABLE " + ", ".join(f"`{t}`" for t in tables))
        assert isinstance(rows, list), rows
        sums.update(dict(rows))
    return sums
